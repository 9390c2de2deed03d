"""The calibration pipelines by name, and the rule for falling back from one to the next.

Every pipeline takes the same :class:`Calibration` (the traced model, the batches, the
callbacks and where to run), so callers choose one by name: the memory plan names one, the user
may name another. When a pipeline fails for a reason that is neither memory (the plan's
business) nor a project error (a compressor's or the user's), the next one in order of
preference runs instead, and the reason is kept for the report.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.core.names import BASIC, DATA_FREE, LAYER_SEQUENTIAL, PREFERENCE, SEQUENTIAL
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import LlmcTraceError
from llmc_trace.pipelines.basic import run_basic, run_data_free
from llmc_trace.pipelines.callbacks import Callbacks
from llmc_trace.pipelines.layer_sequential import check_layer_sequential, run_layer_sequential
from llmc_trace.pipelines.residency import InMemory, Residency
from llmc_trace.pipelines.sequential import PipelineStats, run_sequential
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.guards import check_guards, input_signature
from llmc_trace.tracing.trace import concrete_arguments
from llmc_trace.tracing.values import forget_example_data

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Calibration:
    """One calibration run, whatever pipeline carries it out.

    ``traced`` is the model to calibrate, traced on ``batches[0]`` (its ``model`` is the one
    whose weights change); the leaf plan names the sequential targets even when tracing failed.
    ``residency`` says where the weights are (:mod:`~llmc_trace.pipelines.residency`; default:
    in memory); ``twin``, the tiny twin of the same trace, is where checks that need a whole
    forward pass run (layer_sequential's exactness), never on the full-size model.
    """

    traced: TracedModel
    batches: list[dict[str, Any]]
    callbacks: Callbacks
    device: torch.device
    propagate_error: bool = True
    true_sequential: bool = False
    progress: Progress = field(default=no_progress)
    residency: Residency | None = None
    twin: TracedModel | None = None

    @property
    def model(self) -> torch.nn.Module:
        return self.traced.model

    def target_modules(self) -> list[torch.nn.Module]:
        return [self.model.get_submodule(path) for path in self.traced.leaves.targets]

    def forward_kwargs(self) -> dict[str, Any]:
        return concrete_arguments(self.model, self.batches[0])


@dataclass(frozen=True)
class PipelineOutcome:
    """Which pipeline ran, its statistics, and why the ones before it were given up."""

    pipeline: str
    stats: PipelineStats
    fallbacks: list[str]


def fallback_order(chosen: str, available: list[str]) -> list[str]:
    """``chosen`` first, then the ``available`` data pipelines after it in preference order;
    ``data_free`` has no fallback (nothing else can run without data)."""
    if chosen == DATA_FREE:
        return [chosen]
    later = [p for p in PREFERENCE if p in available and PREFERENCE.index(p) > _rank(chosen)]
    return [chosen, *later]


def run_pipelines(order: list[str], calibration: Calibration) -> PipelineOutcome:
    """Run the first pipeline of ``order`` that succeeds (see the module docstring).

    A pipeline that failed after compressing a part has no fallback: the next one would
    compress that part again (and, streamed, part of the checkpoint is written already).
    """
    fallbacks: list[str] = []
    residency = calibration.residency or InMemory(torch.device("cpu"))
    run = dataclasses.replace(calibration, residency=residency)
    for name in order:
        try:
            return PipelineOutcome(name, RUNNERS[name](run), fallbacks)
        except (torch.OutOfMemoryError, LlmcTraceError):
            raise  # memory is the plan's business; a compressor's error is not the pipeline's
        except Exception as err:  # fall back, saying why; never on out-of-memory
            if residency.left_any:
                raise
            logger.warning(
                "pipeline %s failed (%s: %s); falling back", name, type(err).__name__, err
            )
            fallbacks.append(f"{name}: {type(err).__name__}: {err}")
    raise LlmcTraceError(
        "every pipeline failed: " + " | ".join(fallbacks),
        hint="Run with --debug to see each failure's traceback.",
    )


def check_batches_fit(traced: TracedModel, batches: list[dict[str, Any]]) -> None:
    """Every batch must make the decisions the trace took from the first (see guards).

    One graph serves all batches in the sequential pipeline; a batch that would take another
    branch is refused here, before any weight changes, rather than silently run wrongly.
    """
    trace = traced.trace
    assert trace is not None
    seen: set[tuple[Any, ...]] = {input_signature(batches[0])}
    for index, batch in enumerate(batches[1:], start=1):
        signature = input_signature(batch)
        if signature in seen:
            continue
        tensors = {k: v for k, v in batch.items() if k in trace.input_names}
        violations = check_guards(trace.graph, traced.model, trace.guards, tensors)
        if violations:
            raise LlmcTraceError(
                f"calibration batch {index} breaks a decision the trace took from batch 0: "
                f"{violations[0].guard.describe()}, got {violations[0].actual!r}.",
                hint="Use batches of equal shape (packed windows, --batch-size 1 with equal "
                "lengths), or --pipeline basic.",
            )
        seen.add(signature)


def _sequential(run: Calibration) -> PipelineStats:
    traced = run.traced
    if traced.partitioned is None:
        reason = traced.failure.exception if traced.failure else "unknown"
        raise RuntimeError(f"the model does not trace: {reason}")
    check_batches_fit(traced, run.batches)
    forget_example_data([traced.partitioned.trace.graph, *(s.graph for s in traced.subgraphs)])
    return run_sequential(
        run.model,
        traced.subgraphs,
        run.batches,
        run.callbacks,
        device=run.device,
        propagate_error=run.propagate_error,
        true_sequential=run.true_sequential,
        progress=run.progress,
        residency=run.residency,
    )


def _layer_sequential(run: Calibration) -> PipelineStats:
    targets, forward_kwargs = run.target_modules(), run.forward_kwargs()
    problems = _layer_sequential_problems(run)
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
    )


def _layer_sequential_problems(run: Calibration) -> list[str]:
    """layer_sequential's exactness, checked on the twin (the same code at a tiny size) when
    there is one: a check on the full-size model would run all of it at once."""
    checked = run.twin or run.traced
    model = checked.model
    targets = [model.get_submodule(path) for path in checked.leaves.targets]
    batch = checked.sample if run.twin is not None else run.batches[0]
    return check_layer_sequential(model, targets, batch, concrete_arguments(model, batch))


def _basic(run: Calibration) -> PipelineStats:
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


def _data_free(run: Calibration) -> PipelineStats:
    return run_data_free(
        run.model,
        run.target_modules(),
        run.callbacks,
        device=run.device,
        residency=run.residency,
    )


def _rank(name: str) -> int:
    return PREFERENCE.index(name) if name in PREFERENCE else -1


RUNNERS: dict[str, Callable[[Calibration], PipelineStats]] = {
    SEQUENTIAL: _sequential,
    LAYER_SEQUENTIAL: _layer_sequential,
    BASIC: _basic,
    DATA_FREE: _data_free,
}
