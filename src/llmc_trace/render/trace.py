"""Trace a model for drawing: the partitioned graph when tracing works, the partial one when not.

``attempt_trace`` keeps only a report; pictures need the graph itself, its example values and
the leaf plan. The full-size model is built on ``meta``, so even a 405B config costs no memory
and no weight initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx

from llmc_trace.attempt import summarize
from llmc_trace.diagnose.failure import TraceFailure, failure_from_exception
from llmc_trace.errors import BadInputError, LlmcTraceError
from llmc_trace.graph.partition import PartitionedTrace, partition_trace
from llmc_trace.models.build import build_meta_model
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.report import SubgraphSummary
from llmc_trace.tracing.proxy import DataDependentQuestion
from llmc_trace.tracing.targets import LeafPlan, plan_leaves, split_ignore
from llmc_trace.tracing.trace import trace_graph


@dataclass(frozen=True)
class RenderTrace:
    """What the views draw.

    Exactly one of ``partitioned`` (tracing worked) and ``failure`` (it did not) is set.
    ``partial_graph`` is the graph recorded up to the failure and ``failing_node`` the name of
    the node whose value model code asked about, when the failure has one. ``summaries`` hold
    the full-size byte counts of each subgraph.
    """

    name: str
    model: torch.nn.Module
    leaves: LeafPlan
    partitioned: PartitionedTrace | None
    summaries: list[SubgraphSummary]
    failure: TraceFailure | None
    partial_graph: fx.Graph | None
    failing_node: str | None


def display_name(source: ModelSource) -> str:
    """The model's name without the folders above it, so outputs match across machines."""
    if source.kind == "hub" or (source.kind == "builtin" and not Path(source.name).is_absolute()):
        return source.name
    return (source.folder or Path(source.name)).resolve().name


def trace_for_render(
    model: str | ModelSource,
    *,
    modality: str = "text",
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int = 1,
    seq_len: int = 32,
    image_size: int | None = None,
    seed: int = 0,
) -> RenderTrace:
    """Build ``model`` at full size on ``meta``, trace it on a sample, and partition it.

    Never raises for an untraceable model: the result carries the failure instead. Bad input
    (unknown model or modality, targets that match nothing) raises
    :class:`~llmc_trace.errors.BadInputError` before tracing.

    >>> trace = trace_for_render("meta-llama/Llama-2-7b-hf")   # doctest: +SKIP
    >>> len(trace.partitioned.subgraphs)                        # doctest: +SKIP
    33
    """
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    full = build_meta_model(source)
    options = SampleOptions(seq_len=seq_len, image_size=image_size, seed=seed)
    sample = make_sample(full.config, modality, options)
    return trace_module_for_render(
        full,
        sample,
        name=display_name(source),
        sequential_targets=sequential_targets,
        ignore=ignore,
        targets_per_subgraph=targets_per_subgraph,
    )


def trace_module_for_render(
    model: torch.nn.Module,
    sample: dict[str, Any],
    *,
    name: str,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int = 1,
) -> RenderTrace:
    """Trace an already built ``model(**sample)``; see :func:`trace_for_render`."""
    if targets_per_subgraph < 1:
        raise BadInputError(
            f"targets_per_subgraph must be at least 1, got {targets_per_subgraph}.",
            hint="Use 1 for one decoder layer per subgraph.",
            param="targets_per_subgraph",
        )
    # the same plan trace_graph makes; computed here too because a failed trace returns none
    module_patterns, _ = split_ignore(model, list(ignore or []))
    leaves = plan_leaves(model, sequential_targets, module_patterns)
    try:
        traced = trace_graph(model, sample, sequential_targets, ignore)
    except LlmcTraceError:
        raise
    except Exception as err:  # noqa: BLE001 - any other exception is a finding about the model
        return RenderTrace(
            name=name,
            model=model,
            leaves=leaves,
            partitioned=None,
            summaries=[],
            failure=failure_from_exception(err),
            partial_graph=partial_graph_of(err),
            failing_node=err.node.name if isinstance(err, DataDependentQuestion) else None,
        )
    partitioned = partition_trace(traced, targets_per_subgraph)
    return RenderTrace(
        name=name,
        model=model,
        leaves=traced.leaves,
        partitioned=partitioned,
        summaries=summarize(model, partitioned),
        failure=None,
        partial_graph=None,
        failing_node=None,
    )


def partial_graph_of(err: BaseException) -> fx.Graph | None:
    """The graph the tracer had recorded when ``err`` stopped it, if it can be recovered.

    ``trace_graph`` attaches it as ``_llmc_partial_graph``; a data-dependent question also
    knows it through its node.
    """
    graph = getattr(err, "_llmc_partial_graph", None)
    if isinstance(graph, fx.Graph):
        return graph
    if isinstance(err, DataDependentQuestion):
        return err.node.graph
    return None
