"""What every pipeline takes, returns and declares: one calibration run, its statistics, and
the record by which the registry and the memory plan find a pipeline.

A pipeline module defines its runner, its memory estimate beside it, and one :class:`Pipeline`
naming both; :mod:`~llmc_trace.pipelines.registry` lists those records in order of preference,
so adding a pipeline touches its own module and that list (and its name in
:mod:`llmc_trace.core.names`, which the command line reads without importing torch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.pipelines.callbacks import Callbacks
from llmc_trace.pipelines.estimate import EstimateInputs, PipelineEstimate
from llmc_trace.pipelines.residency import Residency
from llmc_trace.pipelines.resume import ResumePoints
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.trace import concrete_arguments


@dataclass
class PipelineStats:
    """What a pipeline run did: passes per subgraph and the cache's peak size."""

    passes: list[int] = field(default_factory=list)
    peak_cache_bytes: int = 0
    shared_names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Calibration:
    """One calibration run, whatever pipeline carries it out.

    ``traced`` is the model to calibrate, traced on ``batches[0]`` (its ``model`` is the one
    whose weights change); the leaf plan names the sequential targets even when tracing failed.
    ``residency`` says where the weights are (:mod:`~llmc_trace.pipelines.residency`; default:
    in memory); ``twin``, the tiny twin of the same trace, is where checks that need a whole
    forward pass run (layer_sequential's exactness), never on the full-size model; ``resume``,
    where a sequential pipeline keeps its state after each part and finds an interrupted
    run's (:mod:`~llmc_trace.pipelines.resume`).
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
    resume: ResumePoints | None = None

    @property
    def model(self) -> torch.nn.Module:
        return self.traced.model

    def target_modules(self) -> list[torch.nn.Module]:
        return [self.model.get_submodule(path) for path in self.traced.leaves.targets]

    def forward_kwargs(self) -> dict[str, Any]:
        return concrete_arguments(self.model, self.batches[0])


@dataclass(frozen=True)
class Pipeline:
    """A pipeline as the registry and the plan see it: its name, how it runs a
    :class:`Calibration`, and its peak memory for a planned run (``None`` when it cannot run
    that model: sequential without a trace)."""

    name: str
    run: Callable[[Calibration], PipelineStats]
    estimate: Callable[[EstimateInputs], PipelineEstimate | None]
