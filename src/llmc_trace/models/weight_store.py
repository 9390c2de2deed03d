"""``WeightStore``: a checkpoint's tensors, read from its safetensors files only when asked.

A 70B checkpoint is 140 GB; compressing it must never hold it. The store knows every tensor's
file, offset, dtype and shape from the headers alone (single ``model.safetensors`` and sharded
folders alike), and :meth:`WeightStore.read` reads each requested tensor's bytes straight into
a tensor of its own (``os.preadv``), one at a time. Not through a memory map: every page
touched through a mapping counts in the process's resident set for as long as the mapping
lives, so reading a group of tensors through one costs their bytes twice (the mapped pages and
the copy), and a mapping kept open grows to the model's size. Read this way, the only copy is
the tensor itself; the file's pages stay in the kernel's page cache, which is not ours.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmc_trace.core.sizes import TensorSpec
from llmc_trace.errors import BadInputError
from llmc_trace.models.weights import check_finite, check_weight_files, missing_tensors

#: safetensors' dtype names, as written in the headers.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class StoredTensor(TensorSpec):
    """What one tensor is and where it lives, from its file's header."""

    file: Path = Path()
    offset: int = 0  # of its first byte in the file


class WeightStore:
    """Every tensor of a checkpoint folder, by name; nothing read until :meth:`read`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors: dict[str, StoredTensor] = {}
        for path in check_weight_files(folder):  # every header is known to parse
            with path.open("rb") as file:
                length = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(length))
            header.pop("__metadata__", None)
            for name, entry in header.items():
                self.tensors[name] = StoredTensor(
                    SAFETENSORS_DTYPES[entry["dtype"]],
                    tuple(entry["shape"]),
                    file=path,
                    offset=8 + length + entry["data_offsets"][0],
                )

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def read(
        self,
        names: Iterable[Source],
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> dict[Source, torch.Tensor]:
        """The tensors ``names``, as fresh tensors on ``device`` (floating ones cast to ``dtype``
        when given), read one at a time (see the module docstring); a :class:`Stacked` source
        is assembled expert by expert into its fused tensor. Each is checked for NaN and inf
        as it arrives (:func:`~llmc_trace.models.weights.check_finite`), before any use."""
        names = list(names)
        out: dict[Source, torch.Tensor] = {}
        for stacked in [n for n in names if isinstance(n, Stacked)]:
            out[stacked] = self._assemble(stacked, device, dtype)
        by_file: dict[Path, list[str]] = {}
        for name in names:
            if isinstance(name, str):
                by_file.setdefault(self.tensors[name].file, []).append(name)
        for path, wanted in by_file.items():
            fd = os.open(path, os.O_RDONLY)
            try:
                for name in wanted:
                    tensor = _read(fd, self.tensors[name], name)
                    check_finite(self.folder, name, tensor)
                    if dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    out[name] = tensor.to(device)
            finally:
                os.close(fd)
        return out

    def _assemble(
        self, stacked: Stacked, device: torch.device | str, dtype: torch.dtype | None
    ) -> torch.Tensor:
        """A fused experts tensor from its per-expert tensors, each copied into its place as
        soon as it is read, so one expert's tensors are the only extra memory."""
        spec = self.spec(stacked)
        kind = dtype if dtype is not None and spec.dtype.is_floating_point else spec.dtype
        fused = torch.empty(spec.shape, dtype=kind, device=device)
        for expert, names in enumerate(stacked.parts):
            start = 0
            read = self.read(names)
            for tensor in (read.pop(name) for name in names):
                fused[expert, start : start + tensor.shape[0]].copy_(tensor)
                start += tensor.shape[0]
        return fused

    def spec(self, source: Source) -> TensorSpec:
        """Dtype and shape of ``source`` (a stacked one as its fused tensor)."""
        if isinstance(source, str):
            return self.tensors[source]
        first = self.tensors[source.parts[0][0]]
        rows = sum(self.tensors[name].shape[0] for name in source.parts[0])
        return TensorSpec(first.dtype, (len(source.parts), rows, *first.shape[1:]))


@dataclass(frozen=True)
class Stacked:
    """A fused experts parameter a checkpoint stores one tensor per expert (the published
    layout of most MoE models): ``parts[e]`` names expert ``e``'s tensors, joined along their
    first dimension (gate, then up), and the experts are stacked in order, as transformers
    joins them when it loads such a checkpoint."""

    parts: tuple[tuple[str, ...], ...]


Source = str | Stacked
"""Where a parameter's values are in a checkpoint: one stored tensor, or several stacked."""


def _read(fd: int, stored: StoredTensor, name: str) -> torch.Tensor:
    """One tensor's bytes from ``fd`` into a new CPU tensor."""
    tensor = torch.empty(stored.shape, dtype=stored.dtype)
    buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < stored.nbytes:  # one read moves at most about 2 GiB on Linux
        count = os.preadv(fd, [buffer[done:]], stored.offset + done)
        if count == 0:
            raise OSError(f"{stored.file} ends inside tensor {name}")
        done += count
    return tensor


def stored_names(model: torch.nn.Module, store: WeightStore) -> dict[str, Source]:
    """For each parameter of ``model`` (under its first name), where ``store`` holds it: the
    name it is saved under (a tied parameter may be saved under any of its names; a name the
    architecture's published checkpoints spell differently, such as Mixtral's
    ``block_sparse_moe``, as transformers renames it at load), or the per-expert tensors a
    fused experts parameter is stacked from. Raises :class:`~llmc_trace.errors.BadInputError`
    for a tensor the files lack, shape otherwise, or store as integers where the model computes
    in floating point (cast silently, int8 weights ran GPTQ on garbage and failed mid-run)."""
    aliases: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    floating: dict[int, bool] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
        shapes[id(param)] = tuple(param.shape)
        floating[id(param)] = param.is_floating_point()
    canonical = _canonical_names(model, store)
    found: dict[str, Source] = {}
    missing: list[str] = []
    for identity, names in aliases.items():
        stored = next((canonical[name] for name in names if name in canonical), None)
        if stored is None:
            stored = _stacked(model, names[0], canonical)
        if stored is None:
            missing.append(names[0])
            continue
        if tuple(store.spec(stored).shape) != shapes[identity]:
            raise BadInputError(
                f"The weights in {store.folder} do not fit its config: {names[0]} is "
                f"{store.spec(stored).shape} in the file, {shapes[identity]} by the config.",
                hint="Every tensor must have the shape its config.json implies: check that the "
                "weights and config.json come from the same checkpoint.",
                param="model",
            )
        if floating[identity]:
            check_float_storage(store, names[0], store.spec(stored))
        found[names[0]] = stored
    if missing:
        raise missing_tensors(store.folder, sorted(missing))
    return found


def check_float_storage(store: WeightStore, name: str, spec: TensorSpec) -> None:
    """Refuse parameter ``name``, floating point in the model, stored as integers (``spec``)
    in a checkpoint whose config names no quantization_config to read them by: loaders cast
    them silently, and GPTQ or a perplexity then runs on garbage."""
    if not spec.dtype.is_floating_point:
        raise BadInputError(
            f"The weights in {store.folder} are not floating point: {name} is stored as "
            f"{spec.dtype}, and config.json names no quantization_config that says how to "
            "read it.",
            hint="Point --model at the float checkpoint (bfloat16, float16 or float32) the "
            "integer one was made from.",
            param="model",
        )


def _canonical_names(model: torch.nn.Module, store: WeightStore) -> dict[str, str]:
    """Each stored name as the model names it (after the renamings transformers applies to
    the architecture's checkpoints at load), mapped to the stored name."""
    renamings = _renamings(model)
    names = {name: name for name in store.tensors}
    for stored in store.tensors:
        name = stored
        for renaming in renamings:  # each in turn, as transformers renames at load
            name, _ = renaming.rename_source_key(name)
        names.setdefault(name, stored)
    return names


def _renamings(model: torch.nn.Module) -> list[Any]:
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return []
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    return [
        t
        for t in get_model_conversion_mapping(model, add_legacy=False)
        if isinstance(t, WeightRenaming)
    ]


def _stacked(model: torch.nn.Module, name: str, canonical: dict[str, str]) -> Stacked | None:
    """The per-expert tensors fused experts parameter ``name`` is stacked from, when the
    checkpoint holds every one of them."""
    from llmc_trace.moe import is_fused_experts, per_expert_names

    path, _, attr = name.rpartition(".")
    if attr not in ("gate_up_proj", "down_proj"):
        return None
    module = model.get_submodule(path)
    if not is_fused_experts(module):
        return None
    leaves = per_expert_names(model, path)
    if leaves is None:
        return None
    parts = (leaves.gate, leaves.up) if attr == "gate_up_proj" else (leaves.down,)
    experts = int(module.down_proj.shape[0])
    wanted = [[f"{path}.{e}.{leaf}.weight" for leaf in parts] for e in range(experts)]
    if not all(n in canonical for group in wanted for n in group):
        return None
    return Stacked(tuple(tuple(canonical[n] for n in group) for group in wanted))
