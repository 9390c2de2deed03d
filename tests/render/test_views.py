"""Each view draws exactly the graph elements it should, computed here another way."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from llmc_trace.diagnose.failure import describe_node
from llmc_trace.graph.structure import subgraph_signature
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.render import draw, render_svg
from llmc_trace.traced.model import TracedModel, trace_source
from llmc_trace.render.drawing import COLORS
from llmc_trace.core.markup import safe_id
from llmc_trace.render.modules import MAX_MODULES
from llmc_trace.render.roles import module_role
from llmc_trace.errors import TraceStopped
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.settings import TracingSettings
from llmc_trace.tracing.trace import trace_graph
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET, LEAF_TARGET
from tests.patterns import untraceable as patterns
from tests.render.helpers import (
    bbox_of,
    failing_trace,
    fill_of,
    llama_config,
    svg_clusters,
    svg_edges,
    svg_nodes,
)


class NumpyOfTracedValue(patterns.Stack):
    """Model code handing a tensor to NumPy, which a traced value cannot follow."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return x * float(np.asarray(grid).sum())


def identical_runs(trace: TracedModel) -> int:
    """Runs of consecutive subgraphs with the same operations and parameter bytes."""
    keys = [
        (subgraph_signature(s), summary.parameter_bytes)
        for s, summary in zip(trace.subgraphs, trace.summaries)
    ]
    return 1 + sum(1 for a, b in pairwise(keys) if a != b)


def model_inputs_read(trace: TracedModel) -> set[str]:
    subgraphs = trace.partitioned.subgraphs  # type: ignore[union-attr]
    produced = {name for s in subgraphs for name in s.output_names}
    return {name for s in subgraphs for name in s.input_names if name not in produced}


def readers_of(trace: TracedModel) -> dict[str, list[int]]:
    """Every value a subgraph reads, with the subgraphs that read it."""
    readers: dict[str, list[int]] = {}
    for subgraph in trace.subgraphs:
        for name in subgraph.input_names:
            readers.setdefault(name, []).append(subgraph.index)
    return readers


@pytest.mark.parametrize("expand", [False, True])
def test_overview_has_one_box_per_subgraph_or_run_and_one_per_model_input(
    llama70b_trace: TracedModel, expand: bool
) -> None:
    """80 identical layers fold into one box (the last one also holds the head's norm and
    lm_head, so it stays apart); expanded, every subgraph has its box."""
    trace = llama70b_trace
    nodes = svg_nodes(render_svg(draw(trace, "overview", expand=expand)))
    boxes = len(trace.subgraphs) if expand else identical_runs(trace)
    assert not expand and boxes == 3 or expand and boxes == 81
    shared = [i for i in nodes if i.startswith("v-")]
    assert len(nodes) == boxes + len(model_inputs_read(trace)) + len(shared)
    assert {f"in-{name}" for name in model_inputs_read(trace)} <= set(nodes)
    if expand:
        assert {f"sg-{s.index}" for s in trace.subgraphs} <= set(nodes)
    else:
        assert {"sg-0", "sg-1-79", "sg-80"} <= set(nodes)


@pytest.mark.parametrize("expand", [False, True])
def test_values_read_by_many_subgraphs_are_drawn_once(
    llama70b_trace: TracedModel, expand: bool
) -> None:
    """The mask, rotary tables and position ids are read by all 80 layers: each appears in one
    shared node with one edge in (from its writer) and one out (to where the cache drops
    it), never as an edge per reader."""
    trace = llama70b_trace
    svg = render_svg(draw(trace, "overview", expand=expand))
    nodes, edges = svg_nodes(svg), svg_edges(svg)
    shared = {name: r for name, r in readers_of(trace).items() if len(r) > 1}
    assert {"create_causal_mask", "model_rotary_emb"} <= set(shared)
    assert all(len(r) == 80 for r in shared.values())

    def text(group: ET.Element) -> str:
        return " ".join(t.text or "" for t in group.iter() if t.tag.endswith("text"))

    for name, indices in shared.items():
        holders = [i for i, g in nodes.items() if f"{name}:" in text(g)]
        assert len(holders) == 1 and holders[0].startswith("v-"), name
        node = holders[0]
        assert [e for e in edges if e.startswith(f"{node}->")] == [f"{node}->sg-{indices[-1]}"]
        assert [e for e in edges if e.endswith(f"->{node}")] == ["sg-0->" + node]
        assert f"read by #{indices[0]}–{indices[-1]}" in text(nodes[node])
        assert not any(f"{name}:" in text(g) for g in edges.values())
    # the residual stream goes to the next subgraph only: a solid edge
    chain = edges["sg-1->sg-2" if expand else "sg-0->sg-1-79"]
    assert not any(p.get("stroke-dasharray") for p in chain.iter() if p.tag.endswith("path"))


def detail_references(trace: TracedModel, chosen: list[Subgraph]) -> tuple[set[str], set[str]]:
    """What the detail view must draw, from the subgraphs' interfaces: every operation, and
    in each subgraph's box a reference to every value it does not get by an edge (model
    inputs, attributes, values of subgraphs not drawn, values several subgraphs read)."""
    drawn = {s.index for s in chosen}
    writer = {name: s.index for s in trace.subgraphs for name in s.output_names}
    readers = readers_of(trace)
    operations = {
        f"n-{n.name}"
        for s in chosen
        for n in s.graph.nodes
        if n.op not in ("placeholder", "get_attr", "output")
    }
    references = set()
    for s in chosen:
        for name in s.input_names:
            if writer.get(name) not in drawn or len(readers[name]) > 1:
                references.add(f"sg{s.index}-x-{name}")
        references |= {f"sg{s.index}-a-{n.target}" for n in s.graph.nodes if n.op == "get_attr"}
    return operations, references


@pytest.mark.parametrize("indices", [None, [0, 2]])
def test_detail_draws_the_operations_of_chosen_subgraphs_and_their_interface(
    llama_trace: TracedModel, indices: list[int] | None
) -> None:
    subgraphs = llama_trace.subgraphs
    chosen = [s for s in subgraphs if indices is None or s.index in indices]
    operations, references = detail_references(llama_trace, chosen)
    has_output = chosen[-1] is subgraphs[-1]
    nodes = svg_nodes(render_svg(draw(llama_trace, "detail", indices)))
    assert set(nodes) == operations | references | ({"n-output"} if has_output else set())


def test_detail_of_a_deep_model_draws_each_run_of_identical_layers_once(
    llama70b_trace: TracedModel,
) -> None:
    trace = llama70b_trace
    folded = render_svg(draw(trace, "detail"))
    assert set(svg_clusters(folded)) >= {"cluster_sg0", "cluster_sg1", "cluster_sg80"}
    assert not {f"cluster_sg{i}" for i in range(2, 80)} & set(svg_clusters(folded))
    assert "stands for #1–79" in folded
    chosen = [trace.subgraphs[i] for i in (0, 1, 80)]
    operations, references = detail_references(trace, chosen)
    # the run's first layer stands in for the rest: the last layer reads the 79th's output
    assert set(svg_nodes(folded)) == operations | references | {"n-output"}
    expanded = render_svg(draw(trace, "detail", expand=True))
    assert {f"cluster_sg{s.index}" for s in trace.subgraphs} <= set(svg_clusters(expanded))


def test_detail_rejects_a_subgraph_the_model_does_not_have(llama_trace: TracedModel) -> None:
    from llmc_trace.errors import BadInputError

    with pytest.raises(BadInputError, match="Subgraph 99 does not exist") as info:
        draw(llama_trace, "detail", [1, 99])
    assert info.value.param == "subgraphs"


@pytest.mark.parametrize("expand", [False, True])
def test_modules_view_nests_each_module_in_its_parent(
    llama70b_trace: TracedModel, expand: bool
) -> None:
    """One box per module (a folded run of identical layers counts once), each drawn inside
    the box of its parent, one module per row."""
    model = llama70b_trace.model
    svg = render_svg(draw(llama70b_trace, "modules", expand=expand))
    nodes, clusters = svg_nodes(svg), svg_clusters(svg)
    per_layer = len(list(model.model.layers[0].modules()))
    hidden = 0 if expand else (len(model.model.layers) - 1) * per_layer
    assert len(nodes) == len(list(model.named_modules())) - hidden
    assert svg_edges(svg) == {}  # nesting, not edges, says who holds whom
    for node_id, group in nodes.items():
        path = node_id.removeprefix("m-")
        parent = path.rpartition(".")[0] if "." in path else "(root)"
        if path == "(root)":
            continue
        left, top, right, bottom = bbox_of(group)
        outer = bbox_of(clusters[safe_id("cluster_m-", parent)])
        assert outer[0] < left and outer[1] < top and right < outer[2] and bottom < outer[3]
    rows = sorted(bbox_of(g)[1] for g in nodes.values())
    assert all(b - a > 10 for a, b in pairwise(rows))  # never two modules side by side


def test_a_huge_module_tree_is_folded_even_when_expanded(tmp_path: Path) -> None:
    """Graphviz needs minutes for ~10^4 modules (switch-large-128 has 16407): fold them."""
    per_layer = 13  # a Llama decoder layer's modules, itself included
    layers = MAX_MODULES // per_layer + 1
    llama_config(layers).save_pretrained(tmp_path)
    trace = trace_source(str(tmp_path))
    total = len(list(trace.model.named_modules()))
    assert total > MAX_MODULES
    drawing = draw(trace, "modules", expand=True)
    assert len(drawing.nodes) == total - (layers - 1) * per_layer
    assert "too many to draw" in drawing.caption
    assert drawing.nodes["m-model.layers.0"].title == "model.layers.0"
    assert f"×{layers}" in drawing.dot


def test_modules_view_colours_each_called_module_by_why_it_is_a_leaf(llama_dir: Path) -> None:
    """The tracer records why it did not walk into each module it called: the colours agree."""
    trace = trace_source(
        str(llama_dir), tracing=TracingSettings(tracing_ignore=("re:model\\.norm",))
    )
    nodes = svg_nodes(render_svg(draw(trace, "modules")))
    expected = {
        LEAF_TARGET: COLORS["target"],
        LEAF_IGNORED: COLORS["ignored"],
        LEAF_NO_TARGET: COLORS["leaf"],
    }
    called = trace.partitioned.trace.leaf_reasons  # type: ignore[union-attr]
    assert set(called.values()) == set(expected)
    for path, reason in called.items():
        assert fill_of(nodes[f"m-{path}"]) == expected[reason], path
    assert fill_of(nodes["m-model"]) == COLORS["ancestor"]
    assert fill_of(nodes["m-model.layers.0.mlp.down_proj"]) == COLORS["inside"]
    assert module_role(trace.leaves, "model.layers.0.mlp") == "inside"


@pytest.mark.parametrize("cls", [patterns.ValueBranch, patterns.DataShape, patterns.LoopOverTensor])
def test_failure_view_highlights_the_origin_the_report_names(cls: type) -> None:
    trace = failing_trace(cls)
    assert trace.failure is not None and trace.partial_graph is not None
    nodes = svg_nodes(render_svg(draw(trace, "failure")))
    graph_nodes = {f"n-{n.name}": n for n in trace.partial_graph.nodes}
    assert set(nodes) == {*graph_nodes, "failure"}
    red = [
        graph_nodes[i]
        for i, g in nodes.items()
        if i in graph_nodes and fill_of(g) in (COLORS["failure"], COLORS["origin"])
    ]
    # graph order runs from the model input to the failing node, as the origin does
    assert [describe_node(n) for n in red] == trace.failure.origin[:-1]
    assert fill_of(nodes[f"n-{trace.failing_node}"]) == COLORS["failure"]


def test_failure_caption_names_the_model_line(value_branch_trace: TracedModel) -> None:
    drawing = draw(value_branch_trace, "failure")
    location = value_branch_trace.failure.location  # type: ignore[union-attr]
    assert f"{location.file}:{location.line}" in drawing.caption
    assert "if grid.prod() > 4:" in drawing.caption
    assert "grid → prod → gt → bool" in drawing.caption
    assert "if grid.prod() &gt; 4:" in render_svg(drawing)


def test_failure_without_a_recorded_graph_shows_the_module_stack() -> None:
    """An error raised by model code (not a question to the tracer) still gets a picture."""
    trace = failing_trace(NumpyOfTracedValue)
    assert trace.failure is not None
    nodes = svg_nodes(render_svg(draw(trace, "failure")))
    if trace.partial_graph is None:
        assert len(nodes) == len(trace.failure.module_stack) + 1
    else:
        assert len(nodes) == len(trace.partial_graph.nodes) + 1
    assert "failure" in nodes


def test_the_partial_graph_comes_with_the_failure() -> None:
    """What stops trace_graph carries the graph recorded so far and the module stack."""
    with pytest.raises(TraceStopped) as info:
        trace_graph(
            patterns.Wrapper(patterns.ValueBranch()).eval(),
            {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 2]])},
            TracingOptions(sequential_targets=("Block",)),
        )
    stopped = info.value
    assert isinstance(stopped.partial_graph, torch.fx.Graph)
    assert any(n.op == "placeholder" for n in stopped.partial_graph.nodes)
    assert stopped.module_stack == [("model", "ValueBranch")]


def test_views_that_need_a_trace_refuse_an_untraceable_model(
    value_branch_trace: TracedModel,
) -> None:
    from llmc_trace.errors import NotTraceableError

    for view in ("overview", "detail"):
        with pytest.raises(NotTraceableError, match="not traceable") as info:
            draw(value_branch_trace, view)
        assert "--view failure" in info.value.hint
    modules = svg_nodes(render_svg(draw(value_branch_trace, "modules")))
    assert len(modules) == len(list(value_branch_trace.model.named_modules()))
