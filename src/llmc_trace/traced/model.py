"""``TracedModel``: a model traced once, partitioned, with its failure when tracing stopped.

Every command needs the same thing from a model: its graph cut into subgraphs, which modules
are leaves and why, the guards and opaque calls the trace recorded, the fixes it used, or,
when tracing stopped, where and the graph recorded up to there. One :func:`trace_model` call
makes it; attempt verifies it, render draws it, plan sizes it, the pipelines run its
subgraphs and compress does all of that, each without tracing the model again.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import fx

from llmc_trace.diagnose.failure import TraceFailure, failure_from_exception
from llmc_trace.errors import TraceStopped
from llmc_trace.graph.partition import PartitionedTrace, partition_trace
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.models.build import build_meta_model
from llmc_trace.models.samples import SampleOptions, make_sample, supported_modalities
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.traced.probe import sample_for
from llmc_trace.traced.summary import SubgraphSummary, summarize
from llmc_trace.tracing.decisions import Decision
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.proxy import DataDependentQuestion
from llmc_trace.tracing.settings import TracingSettings, tracing_settings
from llmc_trace.tracing.targets import LeafPlan
from llmc_trace.tracing.trace import TraceResult, trace_graph


@dataclass(frozen=True)
class TracedModel:
    """One trace of ``model(**sample)`` and what became of it.

    Exactly one of ``partitioned`` (tracing worked) and ``failure`` (it stopped) is set.
    ``partial_graph`` is the graph recorded up to the failure and ``failing_node`` the node
    whose value model code asked about, when the failure has one. ``source`` is where the
    model came from (``None`` for a module built by the caller); ``timings_s`` holds
    ``trace_s`` and ``partition_s``; ``decisions`` the branches model code took (up to the
    failure, when it stopped).
    """

    name: str
    model: torch.nn.Module = field(repr=False)
    sample: dict[str, Any] = field(repr=False)
    options: TracingOptions
    leaves: LeafPlan
    partitioned: PartitionedTrace | None
    failure: TraceFailure | None
    partial_graph: fx.Graph | None = field(default=None, repr=False)
    failing_node: str | None = None
    source: ModelSource | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list, repr=False)

    @property
    def traced(self) -> bool:
        return self.partitioned is not None

    @property
    def trace(self) -> TraceResult | None:
        return self.partitioned.trace if self.partitioned is not None else None

    @property
    def subgraphs(self) -> list[Subgraph]:
        return self.partitioned.subgraphs if self.partitioned is not None else []

    @cached_property
    def summaries(self) -> list[SubgraphSummary]:
        """Each subgraph with the bytes of its outputs and parameters."""
        return summarize(self.model, self.partitioned) if self.partitioned is not None else []


def display_name(source: ModelSource) -> str:
    """The model's name without the folders above it, so outputs match across machines."""
    if source.kind == "hub" or (source.kind == "builtin" and not Path(source.name).is_absolute()):
        return source.name
    return (source.folder or Path(source.name)).resolve().name


def trace_model(
    model: torch.nn.Module,
    sample: dict[str, Any],
    options: TracingOptions,
    *,
    name: str,
    source: ModelSource | None = None,
) -> TracedModel:
    """Trace ``model(**sample)`` and partition it; never raises for untraceable model code.

    Bad options (targets that match nothing, an autowrap that cannot install) raise
    :class:`~llmc_trace.errors.BadInputError`.
    """
    traced = functools.partial(
        TracedModel, name=name, model=model, sample=sample, options=options, source=source
    )
    start = time.perf_counter()
    try:
        trace = trace_graph(model, sample, options)
    except TraceStopped as stopped:
        question = stopped.cause if isinstance(stopped.cause, DataDependentQuestion) else None
        return traced(
            leaves=stopped.leaves,
            partitioned=None,
            failure=failure_from_exception(stopped),
            partial_graph=_partial_graph(stopped),
            failing_node=question.node.name if question is not None else None,
            timings_s={"trace_s": time.perf_counter() - start},
            decisions=stopped.decisions,
        )
    traced_s = time.perf_counter() - start
    partitioned = partition_trace(trace, options.targets_per_subgraph)
    partitioned_s = time.perf_counter() - start - traced_s
    return traced(
        leaves=trace.leaves,
        partitioned=partitioned,
        failure=None,
        timings_s={"trace_s": traced_s, "partition_s": partitioned_s},
        decisions=trace.decisions,
    )


def trace_source(
    model: str | ModelSource,
    *,
    tracing: TracingSettings | None = None,
    modality: str = "text",
    sample_options: SampleOptions | None = None,
    record_decisions: bool = False,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int | None = None,
) -> TracedModel:
    """Build ``model`` at full size on ``meta`` (no memory, no initialisation), make a sample
    of ``modality`` from its config, and trace it once as ``tracing`` says (recording the
    branches its code takes with ``record_decisions``, see
    :mod:`~llmc_trace.tracing.decisions`). ``sequential_targets``, ``ignore`` and
    ``targets_per_subgraph`` are deprecated spellings of ``tracing``'s fields.

    Bad input (unknown model or modality, targets or tracing_ignore entries that match
    nothing) raises :class:`~llmc_trace.errors.BadInputError` before tracing.

    >>> traced = trace_source("meta-llama/Llama-2-7b-hf")   # doctest: +SKIP
    >>> len(traced.subgraphs)                               # doctest: +SKIP
    33
    """
    settings = tracing_settings(
        tracing,
        "trace_source",
        {
            "sequential_targets": sequential_targets,
            "ignore": ignore,
            "targets_per_subgraph": targets_per_subgraph,
        },
    )
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    options = sample_options or SampleOptions()
    config = source.config()
    if modality not in supported_modalities(config):
        make_sample(config, modality, options)  # raises the explanatory error
    start = time.perf_counter()
    full = build_meta_model(source)
    built_s = time.perf_counter() - start
    parsed = TracingOptions.parse(
        full,
        settings.tracing_ignore,
        settings.sequential_targets,
        settings.targets_per_subgraph,
    )
    parsed = dataclasses.replace(parsed, record_decisions=record_decisions)
    sample = sample_for(full, modality, options)
    traced = trace_model(full, sample, parsed, name=display_name(source), source=source)
    return dataclasses.replace(traced, timings_s={"build_s": built_s, **traced.timings_s})


def _partial_graph(stopped: TraceStopped) -> fx.Graph | None:
    """The graph recorded up to the failure (a data-dependent question also knows it)."""
    if isinstance(stopped.partial_graph, fx.Graph):
        return stopped.partial_graph
    if isinstance(stopped.cause, DataDependentQuestion):
        return stopped.cause.node.graph
    return None
