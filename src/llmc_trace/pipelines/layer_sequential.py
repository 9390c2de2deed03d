"""The layer-sequential pipeline: capture the first target's inputs, then run target by target.

It needs no graph, only the assumption that each target's output is the next target's first
input and every other argument stays the same (the mask, the rotary embeddings). That holds
for plain decoder stacks and fails for models that do work between layers;
:func:`check_layer_sequential` tests it on a model (the tiny twin) by comparing the inputs each
target sees in a normal forward with those the chain would give it, and the pipeline refuses to
run where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.errors import LlmcTraceError
from llmc_trace.pipelines.cache import move
from llmc_trace.pipelines.callbacks import Callbacks, named_submodules
from llmc_trace.pipelines.sequential import PipelineStats, Progress


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
    propagate_error: bool = True,
    progress: Progress | None = None,
    forward_kwargs: dict[str, Any] | None = None,
) -> PipelineStats:
    """Run each target over every batch's captured call, feeding outputs forward."""
    device = device or torch.device("cpu")
    report = progress or (lambda description, done, total: None)
    kwargs = forward_kwargs or {}
    calls = [capture_first_inputs(model, targets[0], move(b, device), kwargs) for b in batches]
    stats = PipelineStats()
    for position, target in enumerate(targets):
        label = f"target {position + 1}/{len(targets)}"
        named = named_submodules(model, list(target.modules()))
        callbacks.on_subgraph_start(position, named)
        outputs = _run_target(target, calls, label, report, batches, callbacks)
        changed = callbacks.on_calibrated(position, named)
        callbacks.on_subgraph_end(position, named)
        passes = 1
        if changed and propagate_error and position < len(targets) - 1:
            outputs = _run_target(target, calls, label + " · propagate", report)
            passes = 2
        calls = [chain(call, out) for call, out in zip(calls, outputs)]
        stats.passes.append(passes)
    return stats


def _run_target(
    target: torch.nn.Module,
    calls: list[TargetCall],
    label: str,
    report: Progress,
    batches: list[dict[str, Any]] | None = None,
    callbacks: Callbacks | None = None,
) -> list[Any]:
    outputs = []
    with torch.no_grad():
        for index, call in enumerate(calls):
            report(label, index, len(calls))
            if callbacks is not None and batches is not None:
                callbacks.on_batch(batches[index])
            outputs.append(target(*call.args, **call.kwargs))
    return outputs
