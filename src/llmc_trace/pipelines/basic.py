"""The basic pipeline: the whole model, batch by batch, then every compressor at once.

It needs the whole model and every compressor's state (all Hessians) on the device together,
and it propagates no error; it is the reference the other pipelines are checked against, and
the fallback for models that neither trace nor run layer by layer.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.pipelines.cache import move
from llmc_trace.pipelines.callbacks import Callbacks, named_submodules
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
) -> PipelineStats:
    """Run ``model`` on every batch with the callbacks listening on ``target_modules``."""
    device = device or torch.device("cpu")
    report = progress or no_progress
    named = named_submodules(model, [m for t in target_modules for m in t.modules()])
    model.to(device)
    callbacks.on_subgraph_start(0, named)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            report("whole model", index, len(batches))
            callbacks.on_batch(batch)
            model(**move(batch, device), **(forward_kwargs or {}))
    report("whole model", len(batches), len(batches))
    callbacks.on_calibrated(0, named)
    callbacks.on_subgraph_end(0, named)
    return PipelineStats(passes=[1])


def run_data_free(
    model: torch.nn.Module, target_modules: list[torch.nn.Module], callbacks: Callbacks
) -> PipelineStats:
    """No data: the callbacks compress from the weights alone (round-to-nearest)."""
    named = named_submodules(model, [m for t in target_modules for m in t.modules()])
    callbacks.on_subgraph_start(0, named)
    callbacks.on_calibrated(0, named)
    callbacks.on_subgraph_end(0, named)
    return PipelineStats(passes=[0])
