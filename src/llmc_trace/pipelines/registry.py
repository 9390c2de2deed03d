"""The calibration pipelines by name, and the rule for falling back from one to the next.

Every pipeline takes the same :class:`~llmc_trace.pipelines.calibration.Calibration` (the
traced model, the batches, the callbacks and where to run), so callers choose one by name: the
memory plan names one, the user may name another. Each pipeline module declares its runner and
its memory estimate in one :class:`~llmc_trace.pipelines.calibration.Pipeline`;
:data:`PIPELINES` lists them. When a pipeline fails for a reason that is neither memory (the
plan's business) nor a project error (a compressor's or the user's), the next one in order of
preference runs instead, and the reason is kept for the report.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from llmc_trace.core.names import DATA_FREE, PREFERENCE
from llmc_trace.errors import LlmcTraceError
from llmc_trace.pipelines import basic, layer_sequential, sequential
from llmc_trace.pipelines.calibration import Calibration, Pipeline, PipelineStats
from llmc_trace.pipelines.residency import InMemory

logger = logging.getLogger(__name__)


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
            return PipelineOutcome(name, PIPELINES[name].run(run), fallbacks)
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


def _rank(name: str) -> int:
    return PREFERENCE.index(name) if name in PREFERENCE else -1


#: Every pipeline, in the order the memory plan lists their estimates.
PIPELINES: dict[str, Pipeline] = {
    pipeline.name: pipeline
    for pipeline in (
        sequential.PIPELINE,
        layer_sequential.PIPELINE,
        basic.BASIC_PIPELINE,
        basic.DATA_FREE_PIPELINE,
    )
}
