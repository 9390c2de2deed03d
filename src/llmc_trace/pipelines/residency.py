"""Where a model's weights are while a pipeline runs it part by part.

A pipeline works through *groups* of modules (a subgraph, a decoder layer, the whole model):
it announces them all first (:meth:`Residency.prepare`), then :meth:`~Residency.enter`\\ s a
group before running it and :meth:`~Residency.leave`\\ s it once it is compressed and no longer
needed (or :meth:`~Residency.skip`\\ s it, finished by an interrupted run
that this one resumes). What that means is the residency's business:

* :class:`InMemory`: the whole model is loaded; entering moves a group to the execution device
  (and to the compute dtype), leaving moves it back.
* :class:`Streamed`: the model is a skeleton with its parameters on ``meta``
  (:func:`~llmc_trace.models.build.build_skeleton`); entering reads the group's parameters
  from the checkpoint's safetensors files straight to the device, leaving hands each finished
  tensor to ``export`` (the checkpoint writer) and puts ``meta`` back, once no later group
  uses it (a tied embedding stays until the head is done). :meth:`~Streamed.finish` exports
  what no group ran (the head after the last compressed layer), read from disk one tensor at
  a time. Host memory is then one group's weights, whatever the model's size.

The compute dtype is the one the forward passes run in: the checkpoint's own on a GPU, and on
a CPU that multiplies it in hardware (:func:`native_cpu_matmul`); float32 on other CPUs, which
emulate bfloat16 and float16 products several times slower than float32 ones. For a 256x2048
by 2048x5632 product on two cores: bfloat16 6.6x slower than float32 on a CPU without
AVX512-BF16, 3.4x faster on one with it (float16, emulated there, 3.3x slower). Weights read
from a bfloat16 checkpoint are exact in float32, and a compressor quantizes in the checkpoint's
dtype (:class:`~llmc_trace.calibrate.compressor.LayerCompressor`), so the result does not depend
on the compute dtype beyond the activations' rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from llmc_trace.core.device import HOST, place
from llmc_trace.models.weight_store import WeightStore, stored_names

Modules = Sequence[torch.nn.Module]


def compute_dtype(storage: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype forward passes run in on ``device`` for weights stored as ``storage``."""
    if (
        device.type == "cpu"
        and storage in (torch.bfloat16, torch.float16)
        and not native_cpu_matmul(storage)
    ):
        return torch.float32
    return storage


#: torch's probes of the CPU's matrix instructions, per half-precision dtype: any one suffices
_NATIVE_PROBES = {
    torch.bfloat16: ("_is_avx512_bf16_supported", "_is_amx_tile_supported"),
    torch.float16: ("_is_avx512_fp16_supported", "_is_amx_fp16_supported"),
}


def native_cpu_matmul(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies ``dtype`` matrices in hardware (AVX512-BF16 or AMX for
    bfloat16, AVX512-FP16 or AMX-FP16 for float16), as torch's own CPU probes report it; a
    probe this torch lacks counts as no."""
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in _NATIVE_PROBES[dtype])


class Residency(Protocol):
    """What a pipeline calls around each group of modules (see the module docstring).

    ``left_any`` says a group has left: its weights are final (and, streamed, written), so no
    other pipeline may start over.
    """

    left_any: bool

    def prepare(self, groups: Sequence[Modules]) -> None: ...

    def enter(self, modules: Modules, device: torch.device) -> None: ...

    def leave(self, modules: Modules) -> None: ...

    def skip(self, modules: Modules) -> None:
        """A group an interrupted run already finished (and, streamed, wrote): it is not
        entered, and counts as having left."""
        ...

    def finish(self) -> None: ...


def _move_buffers(modules: Modules, device: torch.device) -> None:
    """Buffers keep their dtype (rotary tables stay float32, as transformers keeps them)."""
    for module in modules:
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = place(buffer, device)


class InMemory:
    """Every weight is loaded; a group moves to the device (in ``compute``) while it runs."""

    def __init__(self, offload: torch.device, compute: torch.dtype | None = None) -> None:
        self.offload = offload
        self.compute = compute
        self.left_any = False
        self._stored: dict[int, torch.dtype] = {}

    def prepare(self, groups: Sequence[Modules]) -> None:
        return None

    def enter(self, modules: Modules, device: torch.device) -> None:
        for module in modules:
            for param in module.parameters(recurse=False):
                self._stored.setdefault(id(param), param.dtype)
                param.data = place(param.data, device, self.compute)
        _move_buffers(modules, device)

    def leave(self, modules: Modules) -> None:
        self.left_any = True
        for module in modules:
            for param in module.parameters(recurse=False):
                param.data = place(param.data, self.offload, self._stored.pop(id(param), None))
        _move_buffers(modules, self.offload)

    def skip(self, modules: Modules) -> None:
        self.left_any = True

    def finish(self) -> None:
        return None


class Streamed:
    """Parameters read from ``store`` when their group enters, exported when it leaves.

    ``model`` has its parameters on ``meta``. ``export(name, tensor)`` receives every
    parameter and persistent buffer once, under its first name in ``state_dict`` order
    (a tied parameter's other names are not exported), with the values the pipeline left.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        store: WeightStore,
        export: Callable[[str, torch.Tensor], None],
        compute: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.store = store
        self.export = export
        self.compute = compute
        owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
        keys: dict[int, str] = {}  # each parameter's first name, the one it is exported under
        for module_name, module in model.named_modules(remove_duplicate=False):
            for attr, param in module._parameters.items():
                if param is not None:
                    keys.setdefault(id(param), f"{module_name}.{attr}".lstrip("."))
                    owners.setdefault(id(param), []).append((module, attr))
        self._source = stored_names(model, store)  # our name -> the name the files use
        self._slots: dict[str, list[tuple[torch.nn.Module, str]]] = {}
        self._dtype: dict[str, torch.dtype] = {}  # the skeleton's, restored on release
        self._keys_of: dict[int, list[str]] = {}
        for identity, key in keys.items():
            self._slots[key] = owners[identity]
            module, attr = owners[identity][0]
            self._dtype[key] = module._parameters[attr].dtype  # type: ignore[union-attr]
            for module, _ in owners[identity]:
                self._keys_of.setdefault(id(module), []).append(key)
        self._users: dict[str, int] = {}
        self._exported: set[str] = set()
        self.left_any = False

    def _keys(self, modules: Modules) -> list[str]:
        return list(dict.fromkeys(k for m in modules for k in self._keys_of.get(id(m), [])))

    def prepare(self, groups: Sequence[Modules]) -> None:
        for group in groups:
            for key in self._keys(group):
                self._users[key] = self._users.get(key, 0) + 1

    def enter(self, modules: Modules, device: torch.device) -> None:
        wanted = [k for k in self._keys(modules) if self._param(k).is_meta]
        # a parameter the model keeps in float32 (a router) is read so, not in the compute dtype
        kept = [k for k in wanted if self._dtype[k] == torch.float32]
        read = self.store.read(
            [self._source[k] for k in wanted if k not in kept], device, self.compute
        )
        read.update(self.store.read([self._source[k] for k in kept], device, torch.float32))
        for key in wanted:
            self._install(key, torch.nn.Parameter(read.pop(self._source[key]), requires_grad=False))
        _move_buffers(modules, device)

    def leave(self, modules: Modules) -> None:
        self.left_any = True
        for key in self._keys(modules):
            self._users[key] = self._users.get(key, 1) - 1
            if self._users[key] <= 0:
                self._export(key, self._param(key).detach())
                self._release(key)
        _move_buffers(modules, HOST)

    def skip(self, modules: Modules) -> None:
        """As :meth:`leave`, without the weights: the ones whose last group this was are in
        the checkpoint already."""
        self.left_any = True
        for key in self._keys(modules):
            self._users[key] = self._users.get(key, 1) - 1
            if self._users[key] <= 0:
                self._exported.add(key)

    def finish(self) -> None:
        """Export every tensor no group left (read from disk one at a time), then the
        persistent buffers; the model is a skeleton again afterwards."""
        for key in [k for k in self._slots if k not in self._exported]:
            param = self._param(key)
            value = (
                self.store.read([self._source[key]])[self._source[key]]
                if param.is_meta
                else param.detach()
            )
            self._export(key, value)
            self._release(key)
        parameters = set(self._slots)
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            if name not in parameters and not tensor.is_meta and name not in self._exported:
                self._export(name, tensor.detach())

    def _param(self, key: str) -> torch.nn.Parameter:
        module, attr = self._slots[key][0]
        return module._parameters[attr]  # type: ignore[return-value]

    def _install(self, key: str, param: torch.nn.Parameter) -> None:
        for module, attr in self._slots[key]:
            module._parameters[attr] = param

    def _release(self, key: str) -> None:
        empty = torch.empty(self._param(key).shape, dtype=self._dtype[key], device="meta")
        self._install(key, torch.nn.Parameter(empty, requires_grad=False))

    def _export(self, key: str, value: torch.Tensor) -> None:
        if key not in self._exported:
            self._exported.add(key)
            self.export(key, value)
