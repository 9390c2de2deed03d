"""The layer-sequential pipeline: capture the first target's inputs, then run target by target.

It needs no graph, only the assumption that each target's output is the next target's first
input and every other argument stays the same (the mask, the rotary embeddings). That holds
for plain decoder stacks and fails for models that do work between layers;
:func:`check_layer_sequential` tests it on a model (the tiny twin) by comparing the inputs each
target sees in a normal forward with those the chain would give it, and the pipeline refuses to
run where they differ. :func:`estimate_layer_sequential` sizes it for the memory plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.core.host_memory import release_free_memory
from llmc_trace.core.names import LAYER_SEQUENTIAL
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import LlmcTraceError
from llmc_trace.graph.partition import PartitionedTrace
from llmc_trace.pipelines.cache import move, values_equal
from llmc_trace.pipelines.calibration import Calibration, Pipeline, PipelineStats
from llmc_trace.pipelines.callbacks import Callbacks, modules_outside, named_submodules
from llmc_trace.pipelines.estimate import EstimateInputs, PipelineEstimate, scaled_bytes
from llmc_trace.pipelines.residency import InMemory, Residency
from llmc_trace.pipelines.resume import ResumePoints
from llmc_trace.tracing.trace import concrete_arguments


class _Captured(Exception):
    """Raised by the pre-hook to stop the forward once the first target's inputs are known."""


@dataclass
class TargetCall:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def capture_first_inputs(
    model: torch.nn.Module,
    first: torch.nn.Module,
    batch: dict[str, Any],
    forward_kwargs: dict[str, Any],
) -> TargetCall:
    captured: list[TargetCall] = []

    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.append(TargetCall(args, dict(kwargs)))
        raise _Captured

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**batch, **forward_kwargs)
    except _Captured:
        pass
    finally:
        handle.remove()
    if not captured:
        raise LlmcTraceError(
            "The first sequential target never ran.",
            hint="Check --sequential-targets against the model's forward.",
        )
    return captured[0]


def chain(call: TargetCall, output: Any) -> TargetCall:
    """The next target's call: this output as first argument, everything else unchanged."""
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    return TargetCall((hidden, *call.args[1:]), call.kwargs)


def check_layer_sequential(
    model: torch.nn.Module,
    targets: list[torch.nn.Module],
    batch: dict[str, Any],
    forward_kwargs: dict[str, Any],
) -> list[str]:
    """Problems that make layer-by-layer execution inexact for ``model`` (empty when exact)."""
    seen: list[TargetCall] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append(TargetCall(args, dict(kwargs)))

    handles = [t.register_forward_pre_hook(record, with_kwargs=True) for t in targets]
    try:
        with torch.no_grad():
            model(**batch, **forward_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if len(seen) != len(targets):
        return [f"the targets ran {len(seen)} times for {len(targets)} targets"]
    problems = []
    call = seen[0]
    with torch.no_grad():
        for i, target in enumerate(targets[:-1]):
            call = chain(call, target(*call.args, **call.kwargs))
            actual = seen[i + 1].args[0] if seen[i + 1].args else None
            if (
                not isinstance(actual, torch.Tensor)
                or actual.shape != call.args[0].shape
                or not torch.allclose(actual, call.args[0], rtol=0, atol=1e-5)
            ):
                problems.append(f"target {i + 1} does not receive target {i}'s output unchanged")
                break
    return problems


def run_layer_sequential(
    model: torch.nn.Module,
    targets: list[torch.nn.Module],
    batches: list[dict[str, Any]],
    callbacks: Callbacks,
    *,
    device: torch.device | None = None,
    offload_device: torch.device | None = None,
    propagate_error: bool = True,
    progress: Progress | None = None,
    forward_kwargs: dict[str, Any] | None = None,
    residency: Residency | None = None,
    resume: ResumePoints | None = None,
) -> PipelineStats:
    """Run each target over every batch's captured call, feeding outputs forward.

    Only one target and one batch's call sit on ``device`` at a time, besides the modules
    outside every target (embeddings, final norm, head), which come in first to capture the
    calls; the calls then wait on ``offload_device``, with the arguments every batch shares
    (mask, rotary tables) stored once. ``resume`` receives the calls after each target, and
    gives back an interrupted run's, whose finished targets are then skipped
    (:mod:`~llmc_trace.pipelines.resume`).
    """
    device = device or torch.device("cpu")
    offload = offload_device or torch.device("cpu")
    report = progress or no_progress
    kwargs = forward_kwargs or {}
    residency = residency or InMemory(offload)
    outside = modules_outside(model, targets)
    residency.prepare([outside, *(list(target.modules()) for target in targets)])
    residency.enter(outside, device)
    finished = resume.start(LAYER_SEQUENTIAL) if resume is not None else 0
    calls: list[TargetCall] = []
    stats = PipelineStats()
    if finished:
        calls, stats = resume.restore()  # type: ignore[union-attr]
        for target in targets[:finished]:
            residency.skip(list(target.modules()))
    for batch in batches if not finished else []:
        call = capture_first_inputs(model, targets[0], move(batch, device), kwargs)
        calls.append(share_with(move_call(call, offload), calls[0] if calls else None))
    for position, target in enumerate(targets):
        if position < finished:
            continue
        label = f"target {position + 1}/{len(targets)}"
        named = named_submodules(model, list(target.modules()))
        residency.enter(list(target.modules()), device)
        # as in sequential: a calibration pass that a propagation pass will follow keeps no
        # outputs, and the pass that keeps them replaces each batch's call as it goes
        will_propagate = propagate_error and position < len(targets) - 1
        pieces = callbacks.passes(named)
        for number, piece in enumerate(pieces, start=1):
            final = number == len(pieces)
            callbacks.on_subgraph_start(position, piece)
            _run_target(
                target,
                calls,
                device,
                offload,
                label if len(pieces) == 1 else f"{label} · pass {number}/{len(pieces)}",
                report,
                batches,
                callbacks,
                store=final and not will_propagate,
            )
            callbacks.on_calibrated(position, piece)
            callbacks.on_subgraph_end(position, piece)
        if will_propagate:
            _run_target(target, calls, device, offload, label + " · propagate", report)
        stats.passes.append(len(pieces) + (1 if will_propagate else 0))
        residency.leave(list(target.modules()))
        release_free_memory()
        if resume is not None:
            resume.save(position + 1, (calls, stats))
    residency.leave(outside)
    return stats


def move_call(call: TargetCall, device: torch.device) -> TargetCall:
    return TargetCall(move(call.args, device), move(call.kwargs, device))


def share_with(call: TargetCall, first: TargetCall | None) -> TargetCall:
    """``call`` with every argument equal to ``first``'s replaced by ``first``'s own object.

    The mask and rotary tables of a batch shape are the same for every batch; captured per
    batch they would cost one copy each for the whole run."""
    if first is None:
        return call
    args = tuple(
        mine
        if i == 0 or i >= len(first.args) or not values_equal(mine, first.args[i])
        else first.args[i]
        for i, mine in enumerate(call.args)
    )
    kwargs = {
        key: first.kwargs[key]
        if key in first.kwargs and values_equal(value, first.kwargs[key])
        else value
        for key, value in call.kwargs.items()
    }
    return TargetCall(args, kwargs)


def _run_target(
    target: torch.nn.Module,
    calls: list[TargetCall],
    device: torch.device,
    offload: torch.device,
    label: str,
    report: Progress,
    batches: list[dict[str, Any]] | None = None,
    callbacks: Callbacks | None = None,
    *,
    store: bool = True,
) -> None:
    """Run ``target`` on every call; with ``store``, replace each call by the next target's
    (this output, on ``offload``, as its hidden states) as soon as it is computed."""
    with torch.no_grad():
        for index, call in enumerate(calls):
            report(label, index, len(calls))
            if callbacks is not None and batches is not None:
                callbacks.on_batch(batches[index])
            on_device = move_call(call, device)
            output = target(*on_device.args, **on_device.kwargs)
            del on_device
            if store:
                hidden = output[0] if isinstance(output, (tuple, list)) else output
                calls[index] = chain(call, move(hidden, offload))
            del output
    report(label, len(calls), len(calls))


def _calibrate(run: Calibration) -> PipelineStats:
    """Run a :class:`Calibration` through :func:`run_layer_sequential` where it is exact."""
    targets, forward_kwargs = run.target_modules(), run.forward_kwargs()
    problems = _problems(run)
    if problems:
        raise RuntimeError("layer_sequential is not exact here: " + "; ".join(problems))
    return run_layer_sequential(
        run.model,
        targets,
        run.batches,
        run.callbacks,
        device=run.device,
        propagate_error=run.propagate_error,
        progress=run.progress,
        forward_kwargs=forward_kwargs,
        residency=run.residency,
        resume=run.resume,
    )


def _problems(run: Calibration) -> list[str]:
    """layer_sequential's exactness, checked on the twin (the same code at a tiny size) when
    there is one: a check on the full-size model would run all of it at once."""
    checked = run.twin or run.traced
    model = checked.model
    targets = [model.get_submodule(path) for path in checked.leaves.targets]
    batch = checked.sample if run.twin is not None else run.batches[0]
    return check_layer_sequential(model, targets, batch, concrete_arguments(model, batch))


def estimate_layer_sequential(inputs: EstimateInputs) -> PipelineEstimate:
    """Peak memory of :func:`run_layer_sequential`: one target, one batch's call and the
    modules outside the targets on the device, with the target's compressor state; every
    batch's call on the host."""
    settings, costs = inputs.settings, inputs.costs
    b, s = settings.batch_size, settings.seq_len
    compute = settings.dtype_bytes
    config = inputs.model.config
    text = getattr(config, "text_config", None) or config
    hidden_state = b * s * getattr(text, "hidden_size", 0) * compute
    largest_target, outside = inputs.largest_target_bytes(), inputs.outside_bytes()
    varying, shared = _target_arguments(
        inputs.partitioned, inputs.invariant, b, s, inputs.traced, compute
    )
    # every batch's call (hidden states and per-batch arguments); the pass that keeps outputs
    # replaces each call's hidden states as it goes, so one batch's output comes on top
    calls = inputs.batches * (hidden_state + varying) + shared + hidden_state
    device = (
        outside
        + largest_target
        + max(
            max((c.hessian_bytes for c in costs), default=0) + inputs.working_peak,
            max((c.compress_bytes for c in costs), default=0),
        )
        + 2 * hidden_state
        + varying
        + shared
    )
    return PipelineEstimate(
        LAYER_SEQUENTIAL,
        device_bytes=device,
        host_bytes=settings.host_bytes(
            device,
            outside + largest_target,
            inputs.weights,
            calls,
            inputs.kept,
            inputs.kept_one,
            largest=inputs.largest_tensor_bytes(),
        ),
        cache_bytes=calls,
        detail="one target and one batch on the device, with the modules outside the "
        "targets; every batch's call on the host",
    )


def _target_arguments(
    partitioned: PartitionedTrace | None,
    invariant: set[str],
    batch: int,
    seq: int,
    traced: tuple[int, int],
    float_bytes: int,
) -> tuple[int, int]:
    """Bytes of a target's arguments besides the hidden states (mask, rotary tables):
    ``(per batch, once)``, as layer_sequential stores them (shared when equal for all)."""
    if partitioned is None or not partitioned.trace.target_nodes:
        return 0, 0
    first = partitioned.trace.target_nodes[0]
    varying = shared = 0
    for node in first.all_input_nodes[1:]:
        size = scaled_bytes(node.meta.get("val"), batch, seq, traced, float_bytes)
        if node.name in invariant:
            shared += size
        else:
            varying += size
    return varying, shared


PIPELINE = Pipeline(LAYER_SEQUENTIAL, _calibrate, estimate_layer_sequential)
