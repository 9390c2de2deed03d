"""The basic pipeline: the whole model, batch by batch, then every compressor at once.

It needs the whole model and every compressor's state (all Hessians) on the device together,
and it propagates no error; it is the reference the other pipelines are checked against, and
the fallback for models that neither trace nor run layer by layer.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.pipelines.cache import move
from llmc_trace.pipelines.callbacks import Callbacks, modules_outside, named_submodules
from llmc_trace.pipelines.residency import InMemory, Residency
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.pipelines.sequential import PipelineStats


def run_basic(
    model: torch.nn.Module,
    target_modules: list[torch.nn.Module],
    batches: list[dict[str, Any]],
    callbacks: Callbacks,
    *,
    device: torch.device | None = None,
    progress: Progress | None = None,
    forward_kwargs: dict[str, Any] | None = None,
    residency: Residency | None = None,
) -> PipelineStats:
    """Run ``model`` on every batch with the callbacks listening on ``target_modules``."""
    device = device or torch.device("cpu")
    report = progress or no_progress
    residency = residency or InMemory(torch.device("cpu"))
    named = named_submodules(model, [m for t in target_modules for m in t.modules()])
    everything = list(model.modules())
    residency.prepare([everything])
    residency.enter(everything, device)
    callbacks.on_subgraph_start(0, named)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            report("whole model", index, len(batches))
            callbacks.on_batch(batch)
            model(**move(batch, device), **(forward_kwargs or {}))
    report("whole model", len(batches), len(batches))
    callbacks.on_calibrated(0, named)
    callbacks.on_subgraph_end(0, named)
    residency.leave(everything)
    return PipelineStats(passes=[1])


def run_data_free(
    model: torch.nn.Module,
    target_modules: list[torch.nn.Module],
    callbacks: Callbacks,
    *,
    device: torch.device | None = None,
    residency: Residency | None = None,
) -> PipelineStats:
    """No data: the callbacks compress from the weights alone (round-to-nearest), one target
    at a time, then whatever lies outside every target (the callbacks pick their layers)."""
    device = device or torch.device("cpu")
    residency = residency or InMemory(torch.device("cpu"))
    groups = [list(target.modules()) for target in target_modules]
    groups.append(modules_outside(model, target_modules))
    residency.prepare(groups)
    for index, group in enumerate(groups):
        named = named_submodules(model, group)
        residency.enter(group, device)
        callbacks.on_subgraph_start(index, named)
        callbacks.on_calibrated(index, named)
        callbacks.on_subgraph_end(index, named)
        residency.leave(group)
    return PipelineStats(passes=[0] * len(groups))
