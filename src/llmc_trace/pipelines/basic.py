"""The basic pipeline: the whole model, batch by batch, then every compressor at once.

It needs the whole model and every compressor's state (all Hessians) on the device together,
and it propagates no error; it is the reference the other pipelines are checked against, and
the fallback for models that neither trace nor run layer by layer. The data-free pipeline
(no data: one target's weights at a time) lives here too; :func:`estimate_basic` and
:func:`estimate_data_free` size both for the memory plan.
"""

from __future__ import annotations

from typing import Any

import torch

from transformers import PretrainedConfig

from llmc_trace.core.names import BASIC, DATA_FREE
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.core.sizes import parameter_bytes
from llmc_trace.pipelines.cache import move
from llmc_trace.pipelines.calibration import Calibration, Pipeline, PipelineStats
from llmc_trace.pipelines.callbacks import Callbacks, modules_outside, named_submodules
from llmc_trace.pipelines.estimate import (
    EstimateInputs,
    PipelineEstimate,
    compressing,
    compressing_and_keeping,
)
from llmc_trace.pipelines.residency import InMemory, Residency


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


def _calibrate_basic(run: Calibration) -> PipelineStats:
    """Run a :class:`Calibration` through :func:`run_basic`."""
    return run_basic(
        run.model,
        run.target_modules(),
        run.batches,
        run.callbacks,
        device=run.device,
        progress=run.progress,
        forward_kwargs=run.forward_kwargs(),
        residency=run.residency,
    )


def _calibrate_data_free(run: Calibration) -> PipelineStats:
    """Run a :class:`Calibration` through :func:`run_data_free` (its batches unused)."""
    return run_data_free(
        run.model,
        run.target_modules(),
        run.callbacks,
        device=run.device,
        residency=run.residency,
    )


def estimate_basic(inputs: EstimateInputs) -> PipelineEstimate:
    """Peak memory of :func:`run_basic`: the whole model, every compressor's state and the
    logits on the device at once. On a CPU the integers kept for the checkpoint share that
    memory, and they grow as the Hessians are given up (:func:`compressing_and_keeping`)."""
    settings, costs = inputs.settings, inputs.costs
    b, s = settings.batch_size, settings.seq_len
    everything = parameter_bytes(list(inputs.model.modules()), settings.dtype_bytes)
    logits = b * s * _vocab(inputs.model.config) * 4
    calibrating = sum(c.hessian_bytes for c in costs) + inputs.working_peak + logits
    if settings.device_is_host:  # the device's figure holds the kept integers already
        device, kept = everything + max(calibrating, compressing_and_keeping(costs)), 0
    else:
        device, kept = everything + max(calibrating, compressing(costs)), inputs.kept
    return PipelineEstimate(
        BASIC,
        device_bytes=device,
        host_bytes=settings.host_bytes(
            device,
            everything,
            inputs.weights,
            0,
            kept,
            kept,
            largest=inputs.largest_tensor_bytes(),
        ),
        cache_bytes=0,
        detail="the whole model and every compressor's state on the device at once "
        "(streamed or not, it reads every weight before it starts)",
    )


def estimate_data_free(inputs: EstimateInputs) -> PipelineEstimate:
    """Peak memory of :func:`run_data_free`: the weights of one target (or of what lies
    outside every target) at a time, and no compressor state."""
    device = max(inputs.largest_target_bytes(), inputs.outside_bytes())
    return PipelineEstimate(
        DATA_FREE,
        device_bytes=device,
        host_bytes=inputs.settings.host_bytes(
            device,
            device,
            inputs.weights,
            0,
            inputs.kept,
            inputs.kept_one,
            largest=inputs.largest_tensor_bytes(),
        ),
        cache_bytes=0,
        detail="weights only, one target at a time",
    )


def _vocab(config: PretrainedConfig) -> int:
    text = getattr(config, "text_config", None) or config
    return getattr(text, "vocab_size", 0) or 0


BASIC_PIPELINE = Pipeline(BASIC, _calibrate_basic, estimate_basic)
DATA_FREE_PIPELINE = Pipeline(DATA_FREE, _calibrate_data_free, estimate_data_free)
