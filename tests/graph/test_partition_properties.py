"""Partition invariants on random DAGs (hypothesis), checked against unsplit execution."""

from __future__ import annotations

import operator

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx

from llmc_trace.graph.partition import assign_subgraphs, build_subgraphs, topological_partition
from llmc_trace.graph.verify import replay


class Layers(torch.nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(count))


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[fx.Graph, Layers, list[fx.Node]]:
    """Graphs of adds, muls and target calls, each node reading one or two earlier nodes."""
    size = draw(st.integers(3, 40))
    kinds = draw(st.lists(st.sampled_from(["add", "mul", "target"]), min_size=size, max_size=size))
    model = Layers(max(1, kinds.count("target")))
    graph = fx.Graph()
    nodes = [graph.placeholder("x"), graph.placeholder("y")]
    targets: list[fx.Node] = []
    for kind in kinds:
        a = nodes[draw(st.integers(0, len(nodes) - 1))]
        if kind == "target":
            node = graph.call_module(f"layers.{len(targets)}", (a,))
            targets.append(node)
        else:
            b = nodes[draw(st.integers(0, len(nodes) - 1))]
            fn = operator.add if kind == "add" else operator.mul
            node = graph.call_function(fn, (a, b))
        nodes.append(node)
    sinks = [n for n in nodes[2:] if not n.users] or [nodes[-1]]
    graph.output(tuple(sinks))
    return graph, model, targets


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(1, 3))
def test_partition_invariants(
    case: tuple[fx.Graph, Layers, list[fx.Node]], per_subgraph: int
) -> None:
    graph, model, targets = case
    index = assign_subgraphs(graph, targets, per_subgraph)
    for node, i in index.items():  # each subgraph depends only on earlier ones
        assert all(index.get(n, 0) <= i for n in node.all_input_nodes)
    partitions = topological_partition(graph, targets, per_subgraph)
    placed = [n for part in partitions for n in part]
    assert len(placed) == len(set(placed)) == len(index)  # every node exactly once
    for part in partitions:
        assert sum(n in targets for n in part) <= per_subgraph
    assert sum(n in targets for part in partitions for n in part) == len(targets)

    subgraphs = build_subgraphs(graph, partitions, [str(t.target) for t in targets])
    inputs = {"x": torch.randn(2, 4), "y": torch.randn(2, 4)}
    expected = fx.GraphModule(model, graph)(**inputs)
    with torch.no_grad():
        actual = replay(model, subgraphs, inputs)
    torch.testing.assert_close(actual, expected)
    for i, subgraph in enumerate(subgraphs):  # no consumed name is read later
        later = {n for s in subgraphs[i + 1 :] for n in s.input_names}
        assert not set(subgraph.consumed_names) & later
