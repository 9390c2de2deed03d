"""Trace a model on a sample into an fx graph with what tracing learned about it."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from llmc_trace.errors import BadInputError, LlmcTraceError, TraceStopped
from llmc_trace.tracing.autowrap import StatementRewrite, install_autowraps
from llmc_trace.tracing.decisions import Decision, DecisionRecorder
from llmc_trace.tracing.guards import Guard
from llmc_trace.tracing.opaque import default_opaque_functions, skipped_mask_reaches_traced_code
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.targets import LeafPlan, plan_leaves
from llmc_trace.tracing.tracer import LlmcTracer
from llmc_trace.tracing.definitions import use_definitions


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
    decisions: list[Decision] = field(default_factory=list)  # branches the trace baked in


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
    options: TracingOptions | None = None,
    *,
    hidden_targets: bool = False,
) -> TraceResult:
    """Trace ``model(**sample)`` as ``options`` say (the defaults when ``None``).

    The mask builders of ``transformers.masking_utils`` are always opaque calls; ignored
    modules are leaves; opaque calls are recorded as one graph call each; autowraps move a
    statement into a function recorded as one call (:mod:`~llmc_trace.tracing.autowrap`) and
    definitions trace a class through its registered definition (:mod:`tracing_models`); both
    are installed for this trace only.

    An autowrapped statement that calls sequential targets hides them from calibration, which
    is bad input, unless ``hidden_targets`` allows it (a trace read for its dataflow only).

    Raises :class:`~llmc_trace.errors.TraceStopped` when the model's code cannot be traced, and
    :class:`~llmc_trace.errors.BadInputError` when the options cannot apply to this model.
    """
    options = options or TracingOptions()
    start = time.perf_counter()
    defaults = default_opaque_functions()
    opaque = defaults + [n for n in options.opaque_calls if n not in defaults]
    leaves = plan_leaves(model, options.sequential_targets, list(options.ignored_modules))
    tensors, constants = split_sample(sample)
    concrete = {**concrete_arguments(model, sample), **constants}
    # eval mode for the trace, each module's own mode restored after; a walk that sets only
    # the modules in training costs nothing on a model already in eval mode (thousands of experts)
    training = [module for module in model.modules() if module.training]
    for module in training:
        module.training = False
    try:
        try:
            tracer, graph, replaced, rewrites, decisions = _trace_once(
                model, tensors, concrete, options, leaves, opaque, explicit_masks=False
            )
            redo = skipped_mask_reaches_traced_code(graph)
        except TraceStopped as stopped:
            partial = stopped.partial_graph
            if not (isinstance(partial, fx.Graph) and skipped_mask_reaches_traced_code(partial)):
                raise
            redo = True
        if redo:
            tracer, graph, replaced, rewrites, decisions = _trace_once(
                model, tensors, concrete, options, leaves, opaque, explicit_masks=True
            )
    finally:
        for module in training:
            module.training = True
    target_set = set(leaves.targets)
    target_nodes = [
        node for node in graph.nodes if node.op == "call_module" and node.target in target_set
    ]
    hidden = target_set - {node.target for node in target_nodes}
    if rewrites and hidden and not hidden_targets:
        # the moved statement calls the targets itself: calibration would never see them
        raise BadInputError(
            f"Autowrapping {', '.join(r.entry for r in rewrites)} hides the sequential "
            f"targets {', '.join(sorted(hidden)[:3])}{', ...' if len(hidden) > 3 else ''} "
            "inside one graph call.",
            hint="Autowrap a statement that does not call the targets.",
            param="tracing_ignore",
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
        decisions=decisions,
    )


def _trace_once(
    model: torch.nn.Module,
    tensors: dict[str, torch.Tensor],
    concrete: dict[str, Any],
    options: TracingOptions,
    leaves: LeafPlan,
    opaque: list[str],
    *,
    explicit_masks: bool,
) -> tuple[LlmcTracer, fx.Graph, list[str], list[StatementRewrite], list[Decision]]:
    """One tracer run with the definitions and autowraps installed for it, its decisions
    recorded; a failure in the model's code becomes :class:`~llmc_trace.errors.TraceStopped`
    (with the decisions up to it as ``decisions``)."""
    tracer = LlmcTracer(
        lambda path, module: leaves.leaf_reason(path), opaque, explicit_masks=explicit_masks
    )
    accepted = inspect.signature(type(model).forward).parameters
    recorder = DecisionRecorder(
        tracer,
        model,
        lambda path: leaves.leaf_reason(path) is not None,
        [*tensors, *accepted],
        concrete,
        enabled=options.record_decisions,
    )
    try:
        # definitions first: a statement of a definition's method can be autowrapped too
        with (
            torch.no_grad(),
            use_definitions(model, list(options.definitions)) as replaced,
            recorder,  # before autowraps: they swap in their rewrite of the original source
            install_autowraps(model, list(options.autowraps), tracer.opaque_call) as rewrites,
        ):
            graph = tracer.trace_model(model, tensors, concrete)
    except LlmcTraceError:
        raise  # the user's input was wrong (an autowrap that cannot install, say)
    except Exception as err:  # everything else is a finding about the model's code
        raised = tracer.state.raised
        stack = raised[1] if raised is not None and raised[0] is err else []
        stopped = TraceStopped(err, stack, getattr(tracer, "graph", None), leaves)
        recorder.stopped_by(err)
        stopped.decisions = recorder.decisions()
        raise stopped from err
    return tracer, graph, replaced, rewrites, recorder.decisions()
