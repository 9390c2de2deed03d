"""llm-compressor's sequential helpers, as adapters over llmc-trace's tracer and partition.

Each name keeps the parameters and return type of its namesake in
``llmcompressor.pipelines.sequential.helpers`` (0.14); :mod:`llmc_trace.compat` lists where
the behaviour differs and why.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch
from torch import fx

from llmc_trace.attempt.prove import trace_subgraphs as trace_llmc_subgraphs
from llmc_trace.errors import BadInputError
from llmc_trace.graph import partition
from llmc_trace.graph.subgraph import MODEL_OUTPUT
from llmc_trace.graph.subgraph import Subgraph as LlmcSubgraph
from llmc_trace.tracing.targets import plan_leaves
from llmc_trace.tracing.trace import concrete_arguments


class Subgraph(LlmcSubgraph):
    """llmc-trace's :class:`~llmc_trace.graph.subgraph.Subgraph`, built as llm-compressor
    builds one: ``Subgraph(graph, input_names, consumed_names)``, by position or keyword.

    ``input_names`` and ``consumed_names`` are sets, as there. ``output_names`` are read from
    the graph's output dict; ``index`` and ``targets`` are ours, keyword-only. ``forward(model,
    **inputs)`` returns a dict from output name to value; the last subgraph returns the model's
    own output under :data:`MODEL_OUTPUT` beside it.
    """

    input_names: set[str]  # type: ignore[assignment]
    consumed_names: set[str]  # type: ignore[assignment]

    def __init__(
        self,
        graph: fx.Graph,
        input_names: Iterable[str],
        consumed_names: Iterable[str],
        *,
        index: int = 0,
        targets: Iterable[str] = (),
    ) -> None:
        super().__init__(
            index=index,
            graph=graph,
            input_names=set(input_names),  # type: ignore[arg-type]
            output_names=_output_names(graph),
            targets=list(targets),
            consumed_names=set(consumed_names),  # type: ignore[arg-type]
        )

    @classmethod
    def adopt(cls, subgraph: LlmcSubgraph) -> Subgraph:
        """``subgraph`` (made by llmc-trace's partition) as llm-compressor's callers see it."""
        return cls(
            subgraph.graph,
            subgraph.input_names,
            subgraph.consumed_names,
            index=subgraph.index,
            targets=subgraph.targets,
        )

    def submodules(self, model: torch.nn.Module, recurse: bool = True) -> list[torch.nn.Module]:
        """With ``recurse``, the modules this subgraph calls and their descendants, each once
        and in a deterministic order (what distributed compression needs); without, the
        called modules, one per call."""
        if recurse:
            return super().submodules(model)
        return [model.get_submodule(path) for path in self.module_paths()]


def _output_names(graph: fx.Graph) -> list[str]:
    """The names a subgraph's output dict holds for later subgraphs (the model output aside)."""
    for node in graph.find_nodes(op="output"):
        if isinstance(node.args[0], dict):
            return [name for name in node.args[0] if name != MODEL_OUTPUT]
    return []


def trace_subgraphs(
    model: torch.nn.Module,
    sample_input: dict[str, Any],
    sequential_targets: str | list[str] | None,
    ignore: str | list[str],
    targets_per_subgraph: int = 1,
) -> list[Subgraph]:
    """Trace ``model`` and cut it into subgraphs, each sequential target in exactly one, such
    that executing the subgraphs in order is equivalent to executing the model.

    :func:`llmc_trace.trace_subgraphs` itself, with its rule for ``ignore`` (names this model
    does not have are dropped with one warning), its subgraphs as llm-compressor's class.
    ``ignore`` keeps llm-compressor's name here; it is the native ``tracing_ignore``.
    """
    subgraphs = trace_llmc_subgraphs(
        model,
        sample_input,
        sequential_targets,
        targets_per_subgraph=targets_per_subgraph,
        tracing_ignore=ignore,
    )
    return [Subgraph.adopt(subgraph) for subgraph in subgraphs]


def get_sequential_ancestors(
    model: torch.nn.Module, targets: Collection[torch.nn.Module]
) -> set[torch.nn.Module]:
    """Modules with a sequential target below them, the targets excluded: the modules a trace
    walks into, where every other module is called as one leaf.

    The same rule llmc-trace's tracer follows (:func:`llmc_trace.tracing.targets.plan_leaves`).
    """
    paths = {id(module): path for path, module in model.named_modules()}
    nested = [paths[id(t)] for t in targets if paths.get(id(t))]  # the root holds no target
    if not nested:
        return set()
    pattern = "re:(?:" + "|".join(re.escape(path) for path in nested) + ")"
    ancestors = plan_leaves(model, [pattern], []).ancestors
    excluded = {id(t) for t in targets}
    return {
        module
        for module in (model.get_submodule(path) for path in ancestors)
        if id(module) not in excluded
    }


def find_target_nodes(graph: fx.GraphModule, targets: Collection[torch.nn.Module]) -> set[fx.Node]:
    """The ``call_module`` nodes whose execution is a call of one of the ``targets``."""
    return set(partition.find_target_nodes(graph, targets))


def topological_partition(
    graph: fx.GraphModule, targets: Collection[torch.nn.Module], targets_per_subgraph: int = 1
) -> list[list[fx.Node]]:
    """Partition the graph so that each target sits in exactly one partition and each partition
    depends only on values the partitions before it produce.

    llmc-trace's partition (:func:`llmc_trace.graph.partition.topological_partition`): nodes go
    as early as their inputs allow, and placeholders and attribute reads belong to no partition
    (each subgraph reads model inputs directly and copies the attributes it needs).
    """
    if targets_per_subgraph < 1:
        raise BadInputError(
            f"targets_per_subgraph must be at least 1, got {targets_per_subgraph}.",
            hint="Put 1 or more sequential targets in each subgraph.",
            param="targets_per_subgraph",
        )
    if not graph_is_well_formed(graph.graph):
        raise BadInputError(
            "The graph is not well formed (see graph_is_well_formed).",
            hint="Partition a graph as the tracer made it, or repair it and call graph.lint().",
            param="graph",
        )
    return partition.topological_partition(graph, list(targets), targets_per_subgraph)


def partition_graph(model: torch.nn.Module, partitions: list[list[fx.Node]]) -> list[Subgraph]:
    """Turn each partition into a :class:`Subgraph` returning a dict of the values later
    subgraphs read. ``consumed_names`` stay empty until :func:`trace_consumed_names`.

    ``model`` is the module the graph calls into; each ``call_module`` target must be one of
    its submodules.
    """
    for node in (node for nodes in partitions for node in nodes):
        if node.op == "call_module":
            _check_submodule(model, str(node.target))
    graph = next((nodes[0].graph for nodes in partitions if nodes), fx.Graph())
    return [
        Subgraph(built.graph, built.input_names, (), index=built.index)
        for built in partition.build_subgraphs(graph, partitions, ())
    ]


def _check_submodule(model: torch.nn.Module, path: str) -> None:
    try:
        model.get_submodule(path)
    except AttributeError as err:
        raise BadInputError(
            f"The graph calls module {path!r}, which {type(model).__name__} does not have.",
            hint="Pass the model the graph was traced from.",
            param="model",
        ) from err


def trace_consumed_names(subgraphs: list[LlmcSubgraph]) -> None:
    """Set each subgraph's ``consumed_names`` to the inputs no later subgraph reads, so the
    intermediates cache can drop each value right after its last reader has run."""
    consumed = partition.consumed_after([subgraph.input_names for subgraph in subgraphs])
    for subgraph, names in zip(subgraphs, consumed):
        if isinstance(subgraph.consumed_names, set):
            subgraph.consumed_names.update(names)
        else:
            subgraph.consumed_names = names


def graph_is_well_formed(graph: fx.Graph) -> bool:
    """Is every edge recorded at both ends (``a in b.users`` exactly when ``b`` reads ``a``,
    llm-compressor's rule), and does every node read only nodes of this graph defined before
    it (torch.fx's ``Graph.lint``)? A graph that fails either cannot be partitioned or run."""
    for node in graph.nodes:
        if any(node not in user.all_input_nodes for user in node.users):
            return False
        if any(node not in used.users for used in node.all_input_nodes):
            return False
    try:
        graph.lint()
    except (RuntimeError, ValueError):
        return False
    return True


def populate_concrete_args(
    model: torch.nn.Module, sample_input: Mapping[str, Any]
) -> dict[str, Any]:
    """The value of every ``forward`` parameter that ``sample_input`` does not give: ``[]`` for
    ``*args``, ``{}`` for ``**kwargs``, ``False`` for ``use_cache`` (llmc-trace's rule for a
    trace, :func:`~llmc_trace.tracing.trace.concrete_arguments`), the default otherwise."""
    fixed = concrete_arguments(model, dict(sample_input))
    concrete: dict[str, Any] = {}
    for parameter in inspect.signature(model.forward).parameters.values():
        if parameter.name not in sample_input:
            concrete[parameter.name] = fixed.get(parameter.name, _default(parameter))
    return concrete


def _default(parameter: inspect.Parameter) -> Any:
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return []
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return {}
    if parameter.default is inspect.Parameter.empty:
        raise BadInputError(
            f"forward requires {parameter.name!r}, and the sample input has no value for it.",
            hint=f"Add {parameter.name!r} to the sample input.",
            param="sample_input",
        )
    return parameter.default
