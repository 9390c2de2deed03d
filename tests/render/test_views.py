"""Each view draws exactly the graph elements it should, computed here another way."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from llmc_trace.diagnose.failure import describe_node
from llmc_trace.graph.structure import subgraph_signature
from llmc_trace.render import draw, render_svg
from llmc_trace.traced.model import TracedModel, trace_source
from llmc_trace.render.drawing import COLORS
from llmc_trace.render.modules import MAX_MODULES, module_role
from llmc_trace.errors import TraceStopped
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET, LEAF_TARGET
from tests.patterns import untraceable as patterns
from tests.render.helpers import failing_trace, fill_of, llama_config, svg_edges, svg_nodes


class NumpyOfTracedValue(patterns.Stack):
    """Model code handing a tensor to NumPy, which a traced value cannot follow."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return x * float(np.asarray(grid).sum())


def identical_runs(trace: TracedModel) -> int:
    signatures = [subgraph_signature(s) for s in trace.partitioned.subgraphs]  # type: ignore[union-attr]
    return 1 + sum(1 for a, b in pairwise(signatures) if a != b)


def model_inputs_read(trace: TracedModel) -> set[str]:
    subgraphs = trace.partitioned.subgraphs  # type: ignore[union-attr]
    produced = {name for s in subgraphs for name in s.output_names}
    return {name for s in subgraphs for name in s.input_names if name not in produced}


@pytest.mark.parametrize("collapse", [False, True])
def test_overview_has_one_box_per_subgraph_and_one_per_model_input(
    llama_trace: TracedModel, collapse: bool
) -> None:
    svg = render_svg(draw(llama_trace, "overview", collapse=collapse))
    nodes = svg_nodes(svg)
    subgraphs = llama_trace.partitioned.subgraphs  # type: ignore[union-attr]
    boxes = identical_runs(llama_trace) if collapse else len(subgraphs)
    assert len(nodes) == boxes + len(model_inputs_read(llama_trace))
    assert {f"in-{name}" for name in model_inputs_read(llama_trace)} <= set(nodes)
    if not collapse:
        assert {f"sg-{s.index}" for s in subgraphs} <= set(nodes)


def test_overview_marks_values_kept_past_the_next_subgraph(llama_trace: TracedModel) -> None:
    """The mask and rotary embeddings are read by every layer: a dashed edge to the last."""
    subgraphs = llama_trace.partitioned.subgraphs  # type: ignore[union-attr]
    readers = {}
    for subgraph in subgraphs:
        for name in subgraph.input_names:
            readers.setdefault(name, []).append(subgraph.index)
    kept = [name for name, indices in readers.items() if len(indices) > 1]
    assert kept, "a Llama's layers share the mask and position embeddings"
    edges = svg_edges(render_svg(draw(llama_trace, "overview")))
    last = subgraphs[-1].index
    skip = edges[f"sg-0->sg-{last}"]
    assert any(p.get("stroke-dasharray") for p in skip.iter() if p.tag.endswith("path"))
    text = " ".join(t.text or "" for t in skip.iter() if t.tag.endswith("text"))
    for name in kept:
        assert name in text
    assert f"dropped after #{last}" in text
    # the residual stream goes to the next subgraph only: a solid edge
    chain = edges["sg-1->sg-2"]
    assert not any(p.get("stroke-dasharray") for p in chain.iter() if p.tag.endswith("path"))


@pytest.mark.parametrize(("indices", "collapse"), [(None, False), ([0, 2], False), (None, True)])
def test_detail_draws_the_operations_of_chosen_subgraphs_and_their_interface(
    llama_trace: TracedModel, indices: list[int] | None, collapse: bool
) -> None:
    subgraphs = llama_trace.partitioned.subgraphs  # type: ignore[union-attr]
    chosen = [s for s in subgraphs if indices is None or s.index in indices]
    if collapse:  # the 2 middle layers are identical: the second is not drawn
        signatures = [subgraph_signature(s) for s in chosen]
        chosen = [s for i, s in enumerate(chosen) if i == 0 or signatures[i] != signatures[i - 1]]
    operations = {
        n.name
        for s in chosen
        for n in s.graph.nodes
        if n.op not in ("placeholder", "get_attr", "output")
    }
    attributes = {n.target for s in chosen for n in s.graph.nodes if n.op == "get_attr"}
    inputs = {
        n.name
        for s in chosen
        for n in s.graph.nodes
        if n.op == "placeholder" and n.name not in operations
    }
    has_output = chosen[-1] is subgraphs[-1]
    nodes = svg_nodes(render_svg(draw(llama_trace, "detail", indices, collapse)))
    assert len(nodes) == len(operations) + len(attributes) + len(inputs) + has_output
    assert {f"n-{name}" for name in operations} <= set(nodes)
    assert {f"x-{name}" for name in inputs} <= set(nodes)


def test_detail_rejects_a_subgraph_the_model_does_not_have(llama_trace: TracedModel) -> None:
    from llmc_trace.errors import BadInputError

    with pytest.raises(BadInputError, match="Subgraph 99 does not exist") as info:
        draw(llama_trace, "detail", [1, 99])
    assert info.value.param == "subgraphs"


@pytest.mark.parametrize("collapse", [False, True])
def test_modules_view_draws_the_module_tree(llama_trace: TracedModel, collapse: bool) -> None:
    model = llama_trace.model
    nodes = svg_nodes(render_svg(draw(llama_trace, "modules", collapse=collapse)))
    per_layer = len(list(model.model.layers[0].modules()))
    hidden = (len(model.model.layers) - 1) * per_layer if collapse else 0
    assert len(nodes) == len(list(model.named_modules())) - hidden
    edges = svg_edges(render_svg(draw(llama_trace, "modules", collapse=collapse)))
    assert len(edges) == len(nodes) - 1  # a tree


def test_a_huge_module_tree_is_collapsed_even_unasked(tmp_path: Path) -> None:
    """Graphviz needs minutes for ~10^4 modules (switch-large-128 has 16407): collapse them."""
    per_layer = 13  # a Llama decoder layer's modules, itself included
    layers = MAX_MODULES // per_layer + 1
    llama_config(layers).save_pretrained(tmp_path)
    trace = trace_source(str(tmp_path))
    total = len(list(trace.model.named_modules()))
    assert total > MAX_MODULES
    drawing = draw(trace, "modules")
    assert len(drawing.nodes) == total - (layers - 1) * per_layer
    assert "too many to draw" in drawing.caption
    assert drawing.nodes["m-model.layers.0"].title == "model.layers.0"
    assert f"×{layers}" in drawing.dot


def test_modules_view_colours_each_called_module_by_why_it_is_a_leaf(llama_dir: Path) -> None:
    """The tracer records why it did not walk into each module it called: the colours agree."""
    trace = trace_source(str(llama_dir), ignore=["re:model\\.norm"])
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
