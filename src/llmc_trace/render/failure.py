"""The failure view: the graph traced up to the failure, with the failing operation's origin.

torch.fx stops at the first question it cannot answer; everything recorded before that is
still a valid graph. Drawing it shows what tracing had understood, and the red chain shows
how the offending value came from a model input (``grid -> prod -> gt -> bool``), which is
what a fix must cut: make the module holding it a leaf, or the function an opaque call.
"""

from __future__ import annotations

import graphviz
from torch import fx

from llmc_trace.diagnose.failure import TraceFailure, describe_node
from llmc_trace.render.drawing import (
    COLORS,
    Drawing,
    NodeInfo,
    caption_label,
    html_label,
    new_digraph,
)
from llmc_trace.render.labels import shorten, stable_text
from llmc_trace.render.source import line_id
from llmc_trace.render.nodes import default_style, draw_clustered, draw_edges, fx_node_id
from llmc_trace.traced.model import TracedModel

FAILURE_ID = "failure"


def origin_nodes(failing: fx.Node, origin: list[str]) -> list[fx.Node]:
    """The nodes of the failure's origin chain, failing node first.

    ``origin`` lists node descriptions from a model input to the failing node, then the
    question asked; following the descriptions back from ``failing`` finds the very nodes
    the report names, whatever rule chose them.
    """
    expected = list(reversed(origin[:-1]))
    chain = [failing]
    for description in expected[1:]:
        step = next((n for n in chain[-1].all_input_nodes if describe_node(n) == description), None)
        if step is None:
            break
        chain.append(step)
    return chain


def chain_text(steps: list[str], keep: int = 5) -> str:
    """``a → b → … 30 more … → y → z``: a caption line stays readable on a 30-layer chain."""
    if len(steps) <= 2 * keep + 1:
        return " → ".join(steps)
    hidden = len(steps) - 2 * keep
    return " → ".join([*steps[:keep], f"… {hidden} more …", *steps[-keep:]])


def failure_caption(trace: TracedModel, failure: TraceFailure) -> list[str]:
    """What failed, where, and why, one fact a line (the model's source line included)."""
    lines = [f"{trace.name} · not traceable · {failure.explanation}"]
    if failure.location is not None:
        location = failure.location
        where = f"{location.file}:{location.line} in {location.function}"
        lines.append(f"{where}:   {shorten(location.code, 120)}")
    if failure.module_path:
        lines.append(f"inside module {failure.module_path} ({failure.module_class})")
    if failure.origin:
        lines.append(f"origin: {chain_text(failure.origin)}")
    lines.append(shorten(stable_text(failure.message), 160))
    if trace.partial_graph is None:
        lines.append(
            "The graph recorded before this failure is not available; the module stack is shown."
        )
    return lines


def draw_failure(trace: TracedModel) -> Drawing:
    """The failure view of an untraceable model; see the module docstring."""
    failure = trace.failure
    assert failure is not None, "the failure view needs a failed trace"
    caption = failure_caption(trace, failure)
    legend = [
        (COLORS["failure"], "operation whose value was asked for"),
        (COLORS["origin"], "where that value came from"),
        (COLORS["input"], "model inputs and attributes"),
    ]
    dot = new_digraph("failure", caption_label(caption, legend))
    nodes: dict[str, NodeInfo] = {}
    if trace.partial_graph is None:
        tail = _draw_module_stack(dot, failure, nodes)
    else:
        tail = _draw_partial_graph(dot, trace, failure, nodes)
    question = failure.origin[-1] + "()" if failure.origin else failure.kind
    dot.node(
        FAILURE_ID,
        html_label(f"✗ {question}", [failure.explanation]),
        id=FAILURE_ID,
        shape="octagon",
        fillcolor=COLORS["failure"],
        fontcolor="white",
    )
    nodes[FAILURE_ID] = NodeInfo("failure", tuple(_failure_fields(failure)))
    if tail is not None:
        dot.edge(tail, FAILURE_ID, color=COLORS["failure"], penwidth="2")
    return Drawing(
        view="failure",
        title=f"{trace.name} · failure",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={},
    )


def _draw_partial_graph(
    dot: graphviz.Digraph, trace: TracedModel, failure: TraceFailure, nodes: dict[str, NodeInfo]
) -> str | None:
    """Draw the partial graph; returns the id of the node the failure hangs from."""
    assert trace.partial_graph is not None
    graph_nodes = list(trace.partial_graph.nodes)
    by_name = {n.name: n for n in graph_nodes}
    failing = by_name.get(trace.failing_node or "")
    chain = origin_nodes(failing, failure.origin) if failing is not None else []
    on_chain = {n.name for n in chain}

    def style(node: fx.Node) -> dict[str, str]:
        attrs = default_style(node, trace.leaves)
        if node is failing:
            attrs.update(fillcolor=COLORS["failure"], fontcolor="white", color=COLORS["failure"])
        elif node.name in on_chain:
            attrs.update(fillcolor=COLORS["origin"], color=COLORS["failure"], penwidth="2")
        return attrs

    def edge_style(used: fx.Node, user: fx.Node) -> dict[str, str]:
        if used.name in on_chain and user.name in on_chain:
            return {"color": COLORS["failure"], "penwidth": "2"}
        return {}

    stack = [path for path, _ in failure.module_stack]
    draw_clustered(dot, graph_nodes, trace.model, style, "g", nodes, highlighted=stack)
    draw_edges(dot, graph_nodes, fx_node_id, edge_style)
    if failing is not None:
        return fx_node_id(failing)
    inside = [
        n
        for n in graph_nodes
        if _is_within(str(n.meta.get("module_path") or ""), failure.module_path)
    ]
    last = (inside or graph_nodes)[-1:]
    return fx_node_id(last[0]) if last else None


def _is_within(path: str, scope: str) -> bool:
    return not scope or path == scope or path.startswith(scope + ".")


def _draw_module_stack(
    dot: graphviz.Digraph, failure: TraceFailure, nodes: dict[str, NodeInfo]
) -> str | None:
    """Without a graph, the chain of modules tracing was inside; returns the innermost id."""
    previous = None
    for path, cls in failure.module_stack:
        node_id = f"m-{len(nodes)}"
        dot.node(node_id, html_label(path or "(root)", [cls]), id=node_id, color=COLORS["failure"])
        nodes[node_id] = NodeInfo(path or "(root)", (("module path", path), ("module class", cls)))
        if previous is not None:
            dot.edge(previous, node_id)
        previous = node_id
    return previous


def _failure_fields(failure: TraceFailure) -> list[tuple[str, str]]:
    location = failure.location
    return [
        ("kind", failure.kind),
        ("explanation", failure.explanation),
        ("message", stable_text(failure.message)),
        (
            "source",
            f"{location.file}:{location.line} in {location.function}" if location else "unknown",
        ),
        ("code", location.code if location else ""),
        ("module path", failure.module_path),
        ("module class", failure.module_class),
        ("origin", " → ".join(failure.origin)),
        ("exception", shorten(stable_text(failure.exception), 300)),
        (
            "source view",
            "`llmc-trace render --view source` shows the code the trace ran, each branch it "
            "took, and this line marked"
            + (f" (at #{line_id(location.function, location.line)})" if location else ""),
        ),
    ]
