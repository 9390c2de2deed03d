"""llm-compressor's ``dispatch_for_sequential``: where a model's weights wait and where they run.

llmc-trace's pipelines move weights themselves: each group of modules (a subgraph, a target,
the whole model) goes to the execution device when its turn comes and back to the CPU when it
is done (:class:`~llmc_trace.pipelines.residency.InMemory`). So dispatching a model means
putting its weights on the offload device, taking off the hooks another offloader installed
(they would move weights behind the pipeline's back), and remembering the execution device
for the compat pipelines.
"""

from __future__ import annotations

import weakref

import torch

#: The execution device :func:`dispatch_for_sequential` chose for each model it dispatched.
_ONLOAD_DEVICES: weakref.WeakKeyDictionary[torch.nn.Module, torch.device] = (
    weakref.WeakKeyDictionary()
)


def main_device() -> torch.device:
    """The first accelerator (CUDA, XPU, ...) when there is one, else the CPU."""
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


def onload_device(model: torch.nn.Module) -> torch.device:
    """Where the compat pipelines run ``model``: the device it was dispatched for, else
    :func:`main_device`."""
    return _ONLOAD_DEVICES.get(model) or main_device()


def dispatch_for_sequential(
    model: torch.nn.Module,
    onload_device: torch.device | str | None = None,
    offload_device: torch.device | str | None = None,
) -> torch.nn.Module:
    """Prepare ``model`` for a sequential pipeline and return it: existing offloading hooks
    (accelerate's ``_hf_hook``) are removed, the weights put on ``offload_device`` (the CPU),
    and the pipelines will run it on ``onload_device`` (the accelerator when there is one).

    The model computes what it computed before; only where its weights are changes.
    """
    hooked = [module for module in model.modules() if hasattr(module, "_hf_hook")]
    if hooked:  # only accelerate installs _hf_hook, so it is importable here
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(model, recurse=True)
    model.to(torch.device(offload_device or "cpu"))
    _ONLOAD_DEVICES[model] = torch.device(onload_device) if onload_device else main_device()
    return model
