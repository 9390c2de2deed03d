"""Trace a model on a sample: the single entry point into :mod:`llmc_trace.tracing`."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from llmc_trace.errors import BadInputError
from llmc_trace.tracing.autowrap import StatementRewrite, install_autowraps, is_autowrap_entry
from llmc_trace.tracing.guards import Guard
from llmc_trace.tracing.opaque import default_opaque_functions
from llmc_trace.tracing.targets import LeafPlan, plan_leaves, split_ignore
from llmc_trace.tracing.tracer import LlmcTracer
from llmc_trace.tracing.definitions import is_definition_entry, use_definitions


@dataclass
class TraceResult:
    """A traced graph and what tracing learned about it.

    ``graph`` nodes carry ``meta["val"]`` (example value), ``meta["source"]`` (model line),
    ``meta["module_path"]`` and the static flags; ``target_nodes`` are the ``call_module`` nodes
    of the sequential targets in graph order.
    """

    graph: fx.Graph
    model: torch.nn.Module = field(repr=False)
    leaves: LeafPlan
    target_nodes: list[fx.Node]
    guards: list[Guard]
    opaque_functions: dict[str, list[str]]  # name -> where it was patched
    opaque_recorded: list[str]  # names that became graph nodes, in order
    leaf_reasons: dict[str, str]
    input_names: list[str]
    elapsed_s: float
    rewrites: list[StatementRewrite] = field(default_factory=list)  # autowrapped statements
    definitions: list[str] = field(default_factory=list)  # module paths traced by a definition


def concrete_arguments(model: torch.nn.Module, sample: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments fixed for the trace: caches are off, everything else keeps defaults."""
    parameters = inspect.signature(type(model).forward).parameters
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    concrete: dict[str, Any] = {}
    if ("use_cache" in parameters or accepts_kwargs) and "use_cache" not in sample:
        concrete["use_cache"] = False
    return concrete


def split_sample(sample: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors become graph inputs; anything else is passed as a constant of the trace."""
    tensors = {k: v for k, v in sample.items() if isinstance(v, torch.Tensor)}
    constants = {k: v for k, v in sample.items() if not isinstance(v, torch.Tensor)}
    return tensors, constants


def trace_graph(
    model: torch.nn.Module,
    sample: dict[str, Any],
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
) -> TraceResult:
    """Trace ``model(**sample)`` with the given targets and ignore list.

    ``ignore=None`` means llmc-trace's defaults (the mask builders of
    ``transformers.masking_utils`` are opaque calls). Names in ``ignore`` that match a module
    (class name or ``re:`` path pattern) make it a leaf; other names are functions or methods
    to record as opaque calls. ``autowrap:<function>@<line>`` entries move that statement into
    a function recorded as one call (:mod:`~llmc_trace.tracing.autowrap`), and
    ``tracing_models:<class>`` entries trace that class's registered definition
    (:mod:`tracing_models`); both are installed for this trace only.
    """
    start = time.perf_counter()
    entries = list(ignore or [])
    autowraps = [e for e in entries if is_autowrap_entry(e)]
    definitions = [e for e in entries if is_definition_entry(e)]
    plain = [e for e in entries if e not in autowraps and e not in definitions]
    module_patterns, function_names = split_ignore(model, plain)
    opaque = default_opaque_functions() + [
        n for n in function_names if n not in default_opaque_functions()
    ]
    leaves = plan_leaves(model, sequential_targets, module_patterns)
    tensors, constants = split_sample(sample)
    concrete = {**concrete_arguments(model, sample), **constants}
    tracer = LlmcTracer(lambda path, module: leaves.leaf_reason(path), opaque)
    was_training = model.training
    model.eval()
    try:
        # definitions first: a statement of a definition's method can be autowrapped too
        with (
            torch.no_grad(),
            use_definitions(model, definitions) as replaced,
            install_autowraps(model, autowraps, tracer.opaque_call) as rewrites,
        ):
            graph = tracer.trace_model(model, tensors, concrete)
    except Exception as err:
        # the graph traced up to the failure, for the failure view
        err._llmc_partial_graph = getattr(tracer, "graph", None)  # type: ignore[attr-defined]
        raise
    finally:
        model.train(was_training)
    target_set = set(leaves.targets)
    target_nodes = [
        node for node in graph.nodes if node.op == "call_module" and node.target in target_set
    ]
    hidden = target_set - {node.target for node in target_nodes}
    if rewrites and hidden:
        # the moved statement calls the targets itself: calibration would never see them
        raise BadInputError(
            f"Autowrapping {', '.join(r.entry for r in rewrites)} hides the sequential "
            f"targets {', '.join(sorted(hidden)[:3])}{', ...' if len(hidden) > 3 else ''} "
            "inside one graph call.",
            hint="Autowrap a statement that does not call the targets.",
            param="ignore",
        )
    return TraceResult(
        graph=graph,
        model=model,
        leaves=leaves,
        target_nodes=target_nodes,
        guards=tracer.state.guards,
        opaque_functions=tracer.state.opaque_matches,
        opaque_recorded=tracer.state.opaque_recorded,
        leaf_reasons=tracer.state.leaf_calls,
        input_names=list(tensors),
        elapsed_s=time.perf_counter() - start,
        rewrites=rewrites,
        definitions=replaced,
    )
