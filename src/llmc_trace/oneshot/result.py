"""What ``compress`` returns: each stage's outcome, and the run's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.core.names import INDEPENDENT
from llmc_trace.calibrate.solve import LayerResult
from llmc_trace.oneshot.weight_coverage import KindCoverage
from llmc_trace.spec.stage import Stage
from llmc_trace.pipelines.calibration import PipelineStats
from llmc_trace.plan import MemoryPlan
from llmc_trace.report.schema import CompressionReport
from llmc_trace.traced.model import TracedModel


@dataclass(frozen=True)
class Pruned:
    """The mask a stage left: which layers, to what structure (a quantizing stage after it
    keeps those zeros, and the checkpoint records the sparsity)."""

    sparsity: Sparsity
    layers: list[str]


@dataclass(frozen=True)
class StageResult:
    """What one stage did: the stage as it ran (its ``pipeline`` the one that ran), its plan,
    the pipeline's statistics, the compressed layers, any fallback taken, and the pruning
    mask the model holds after it (its own, or an earlier stage's it kept)."""

    stage: Stage
    plan: MemoryPlan
    stats: PipelineStats
    layers: list[LayerResult]
    fallbacks: list[str]
    #: weights compressed and left, by kind of layer (experts one by one)
    coverage: list[KindCoverage] = field(default_factory=list)
    pruned: Pruned | None = None

    @property
    def pipeline(self) -> str:
        return self.stage.pipeline


@dataclass(frozen=True)
class ResumeStats:
    """The run's resume points (:mod:`~llmc_trace.oneshot.resume`): the subgraphs an
    interrupted run had finished (skipped here), and what keeping the points cost."""

    skipped: int
    saves: int
    bytes_written: int
    seconds: float
    #: the largest the resume state was on disk
    peak_bytes: int


@dataclass(frozen=True)
class CompressionResult:
    """What ``compress`` did and where the checkpoint is. ``pipeline`` is the one that ran, or
    ``independent`` for several stages (each stage's is in ``stages``); ``plan``, ``stats``
    and ``layers`` are the last stage's (the one the checkpoint's integers come from).
    ``report``: every stage's layers as the checkpoint's ``report.json`` holds them."""

    out_dir: Path | None
    #: the compressed model in memory; a skeleton on ``meta`` when it was streamed to out_dir
    model: torch.nn.Module = field(repr=False)
    stages: list[StageResult]
    #: the tracing ignore list the run settled on, fixes included
    tracing_ignore: list[str]
    elapsed_s: float
    traced: TracedModel = field(repr=False)
    report: CompressionReport = field(repr=False)
    #: how the calibration data was read, one sentence each (a column of caption lists, rows
    #: dropped, the tokens calibrated on); the command line prints them
    data_notes: tuple[str, ...] = ()
    #: the resume points of a streamed run that kept them; ``None`` otherwise
    resume: ResumeStats | None = None

    @property
    def pipeline(self) -> str:
        return self.stages[0].pipeline if len(self.stages) == 1 else INDEPENDENT

    @property
    def plan(self) -> MemoryPlan:
        return self.stages[-1].plan

    @property
    def stats(self) -> PipelineStats:
        return self.stages[-1].stats

    @property
    def layers(self) -> list[LayerResult]:
        return self.stages[-1].layers

    @property
    def fallbacks(self) -> list[str]:
        return [fallback for stage in self.stages for fallback in stage.fallbacks]
