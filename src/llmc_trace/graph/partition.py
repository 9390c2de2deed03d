"""Partition a traced graph so that each sequential target sits in exactly one subgraph.

The rule is a single forward pass over the nodes in graph order (linear in nodes and edges):

* the k-th target node (graph order) goes to subgraph ``1 + k // targets_per_subgraph``;
* any other node goes to the *latest* subgraph among its inputs (0 when it reads only model
  inputs or attributes), i.e. as early as its inputs allow;
* placeholders and attribute reads belong to no subgraph: every subgraph reads model inputs
  directly and copies the attribute reads it needs.

Because targets are numbered in graph order, a node never lands before one of its inputs, so
each subgraph depends only on earlier ones. Nodes after the last target (final norm, lm_head)
join the last target's subgraph. An empty head (subgraph 0) is dropped.

In-place operations (``x[mask] = y``, ``x.add_(y)``) have no users in the graph, yet order
matters: an extra edge makes every later reader of the mutated value depend on the mutation,
and the mutation depend on every earlier reader, so no subgraph reads a stale or a
not-yet-written tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from llmc_trace.tracing.mutation import is_mutation
from llmc_trace.graph.subgraph import MODEL_OUTPUT, Subgraph
from llmc_trace.tracing.trace import TraceResult


def mutation_edges(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """Extra dependencies implied by in-place writes (see the module docstring)."""
    extra: dict[fx.Node, list[fx.Node]] = {}
    position = {node: i for i, node in enumerate(nodes)}
    for node in nodes:
        if not is_mutation(node) or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        mutated = node.args[0]
        for reader in mutated.users:
            if reader is node:
                continue
            if position[reader] < position[node]:
                extra.setdefault(node, []).append(reader)  # write after read
            else:
                extra.setdefault(reader, []).append(node)  # read after write
    return extra


def assign_subgraphs(
    graph: fx.Graph, target_nodes: Collection[fx.Node], targets_per_subgraph: int = 1
) -> dict[fx.Node, int]:
    """Subgraph index of every node that belongs to one (see the module docstring)."""
    if targets_per_subgraph < 1:
        raise ValueError(f"targets_per_subgraph must be at least 1, got {targets_per_subgraph}")
    nodes = list(graph.nodes)
    targets = set(target_nodes)
    extra = mutation_edges(nodes)
    index: dict[fx.Node, int] = {}
    seen_targets = 0
    last_index = 0
    for node in nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        inputs = [n for n in node.all_input_nodes if n in index] + [
            n for n in extra.get(node, []) if n in index
        ]
        earliest = max((index[n] for n in inputs), default=0)
        if node in targets:
            assigned = 1 + seen_targets // targets_per_subgraph
            seen_targets += 1
            if assigned < earliest:
                raise AssertionError(f"target {node.name} depends on a later subgraph")
        elif node.op == "output":
            assigned = max(last_index, earliest)
        else:
            assigned = earliest
        index[node] = assigned
        last_index = max(last_index, assigned)
    return index


def topological_partition(
    graph_module: fx.GraphModule | fx.Graph,
    targets: Collection[torch.nn.Module] | Collection[fx.Node],
    targets_per_subgraph: int = 1,
) -> list[list[fx.Node]]:
    """Group the graph's nodes into ordered partitions, one target (group) per partition.

    ``targets`` are the sequential target modules (as llm-compressor takes them) or their
    ``call_module`` nodes. Returns node lists in graph order; partition 0 (the head) is dropped
    when empty.
    """
    graph = graph_module.graph if isinstance(graph_module, fx.GraphModule) else graph_module
    target_list = list(targets)
    if target_list and isinstance(target_list[0], torch.nn.Module):
        if not isinstance(graph_module, fx.GraphModule):
            raise TypeError("target modules need the GraphModule to resolve call_module nodes")
        target_nodes = find_target_nodes(graph_module, target_list)  # type: ignore[arg-type]
    else:
        target_nodes = target_list  # type: ignore[assignment]
    index = assign_subgraphs(graph, target_nodes, targets_per_subgraph)
    count = max(index.values(), default=0) + 1
    partitions: list[list[fx.Node]] = [[] for _ in range(count)]
    for node in graph.nodes:
        if node in index:
            partitions[index[node]].append(node)
    return [p for i, p in enumerate(partitions) if p and not (i == 0 and _only_output(p))]


def find_target_nodes(
    graph_module: fx.GraphModule, targets: Collection[torch.nn.Module]
) -> list[fx.Node]:
    """The ``call_module`` nodes that call one of the ``targets`` modules, in graph order."""
    wanted = {id(module) for module in targets}
    return [
        node
        for node in graph_module.graph.nodes
        if node.op == "call_module" and id(graph_module.get_submodule(node.target)) in wanted
    ]


def _only_output(partition: list[fx.Node]) -> bool:
    return all(node.op == "output" for node in partition)


def build_subgraphs(
    graph: fx.Graph, partitions: list[list[fx.Node]], target_paths: Collection[str]
) -> list[Subgraph]:
    """Turn node partitions into executable :class:`Subgraph` objects with consumed names."""
    owner: dict[fx.Node, int] = {n: i for i, part in enumerate(partitions) for n in part}
    readers: dict[str, set[int]] = {}
    for i, part in enumerate(partitions):
        for node in part:
            for used in node.all_input_nodes:
                if used.op != "get_attr" and owner.get(used) != i:
                    readers.setdefault(used.name, set()).add(i)
    target_set = set(target_paths)
    subgraphs = []
    for i, part in enumerate(partitions):
        outputs = [n.name for n in part if any(r > i for r in readers.get(n.name, ()))]
        # a value written in place here but owned elsewhere is re-emitted, so a cache that
        # holds copies (offloaded to the CPU) sees the write
        for node in part:
            if is_mutation(node) and isinstance(node.args[0], fx.Node):
                mutated = node.args[0]
                if (
                    owner.get(mutated) != i
                    and mutated.op != "get_attr"
                    and mutated.name not in outputs
                ):
                    if any(r > i for r in readers.get(mutated.name, ())):
                        outputs.append(mutated.name)
        sub = _copy_partition(part, owner, i, outputs)
        input_names = [n.name for n in sub.nodes if n.op == "placeholder"]
        targets = [str(n.target) for n in part if n.op == "call_module" and n.target in target_set]
        subgraphs.append(Subgraph(i, sub, input_names, outputs, targets))
    for subgraph, consumed in zip(subgraphs, consumed_after([s.input_names for s in subgraphs])):
        subgraph.consumed_names = consumed
    return subgraphs


def consumed_after(input_names: Sequence[Collection[str]]) -> list[list[str]]:
    """For each subgraph (given by the names it reads, in execution order), the names no later
    subgraph reads: the cache can drop them once it has run."""
    last_reader = {name: i for i, names in enumerate(input_names) for name in names}
    return [
        [name for name in names if last_reader[name] == i] for i, names in enumerate(input_names)
    ]


def _copy_partition(
    part: list[fx.Node], owner: dict[fx.Node, int], index: int, outputs: list[str]
) -> fx.Graph:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    by_name: dict[str, fx.Node] = {}
    attrs: dict[str, fx.Node] = {}

    def lookup(node: fx.Node) -> fx.Node:
        if node in env:
            return env[node]
        if node.op == "get_attr":
            if node.target not in attrs:
                attrs[node.target] = graph.get_attr(node.target)
                attrs[node.target].meta = dict(node.meta)
            return attrs[node.target]
        placeholder = graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
        env[node] = by_name[node.name] = placeholder
        return placeholder

    for node in part:
        if node.op == "output":
            result = fx.node.map_arg(node.args[0], lookup)
            graph.output({MODEL_OUTPUT: result, **{name: by_name[name] for name in outputs}})
            continue
        for used in node.all_input_nodes:
            lookup(used)
        env[node] = by_name[node.name] = graph.node_copy(node, lookup)
    if not any(n.op == "output" for n in part):
        graph.output({name: by_name[name] for name in outputs})
    return graph


@dataclass(frozen=True)
class PartitionedTrace:
    """A trace with its subgraphs (what the pipelines run)."""

    trace: TraceResult
    subgraphs: list[Subgraph]


def partition_trace(trace: TraceResult, targets_per_subgraph: int = 1) -> PartitionedTrace:
    """Partition a :class:`TraceResult` into executable subgraphs."""
    partitions = topological_partition(trace.graph, trace.target_nodes, targets_per_subgraph)
    return PartitionedTrace(trace, build_subgraphs(trace.graph, partitions, trace.leaves.targets))
