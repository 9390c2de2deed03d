"""The overview: one box per subgraph, one edge per value handed between subgraphs.

This is the picture of the sequential pipeline's intermediates cache. An edge runs from the
subgraph that writes a value to the last subgraph that reads it, where the cache drops it
(its ``consumed_names``). Values read by anything but the very next subgraph (attention masks,
position embeddings, residual streams that skip layers) are kept in the cache for longer; their
edges are dashed and coloured so they stand out. Edges with the same ends are merged.

With ``collapse``, runs of consecutive subgraphs with the same signature (the same operations
with layer numbers erased) become one box, so an 80-layer model reads like a 3-layer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import graphviz
from torch import fx

from llmc_trace.core.sizes import value_bytes
from llmc_trace.graph.structure import subgraph_signature
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.render.drawing import (
    COLORS,
    Drawing,
    NodeInfo,
    SubgraphInfo,
    caption_label,
    html_label,
    new_digraph,
    table_label,
)
from llmc_trace.render.labels import (
    describe_value,
    human_bytes,
    index_ranges,
    node_fields,
    plural,
    safe_id,
)
from llmc_trace.traced.model import TracedModel


@dataclass(frozen=True)
class Handoff:
    """One value written by ``producer`` (``None``: a model input) and read by ``readers``."""

    name: str
    producer: int | None
    readers: tuple[int, ...]
    dropped: bool  # the last reader lists it in consumed_names

    def skips(self, first_index: int) -> bool:
        """True when the value is kept past the very next subgraph."""
        following = first_index if self.producer is None else self.producer + 1
        return self.readers != (following,)


def handoffs(subgraphs: Sequence[Subgraph]) -> list[Handoff]:
    """Every value crossing a subgraph boundary, in the order subgraphs read them.

    A value rewritten in place by a later subgraph is re-emitted by it; readers after that
    read the new copy, so each (value, writer) pair is its own hand-off.
    """
    writers: dict[str, list[int]] = {}
    for subgraph in subgraphs:
        for name in subgraph.output_names:
            writers.setdefault(name, []).append(subgraph.index)
    readers: dict[tuple[str, int | None], list[int]] = {}
    for subgraph in subgraphs:
        for name in subgraph.input_names:
            earlier = [w for w in writers.get(name, []) if w < subgraph.index]
            key = (name, max(earlier) if earlier else None)
            readers.setdefault(key, []).append(subgraph.index)
    consumed = {(name, s.index) for s in subgraphs for name in s.consumed_names}
    return [
        Handoff(name, producer, tuple(indices), (name, indices[-1]) in consumed)
        for (name, producer), indices in readers.items()
    ]


def runs_of_equal_subgraphs(subgraphs: Sequence[Subgraph], collapse: bool) -> list[list[Subgraph]]:
    """Consecutive subgraphs with one signature, grouped (each alone unless ``collapse``)."""
    if not collapse:
        return [[s] for s in subgraphs]
    runs: list[list[Subgraph]] = []
    previous: tuple[str, ...] | None = None
    for subgraph in subgraphs:
        signature = subgraph_signature(subgraph)
        if runs and signature == previous:
            runs[-1].append(subgraph)
        else:
            runs.append([subgraph])
        previous = signature
    return runs


def run_id(run: Sequence[Subgraph]) -> str:
    first, last = run[0].index, run[-1].index
    return safe_id("sg-", str(first) if first == last else f"{first}-{last}")


def draw_overview(trace: TracedModel, collapse: bool = False) -> Drawing:
    """The overview of a traced model; see the module docstring."""
    assert trace.partitioned is not None, "the overview needs a traced model"
    subgraphs = trace.partitioned.subgraphs
    graph_nodes = {node.name: node for node in trace.partitioned.trace.graph.nodes}
    runs = runs_of_equal_subgraphs(subgraphs, collapse)
    box_of = {s.index: run_id(run) for run in runs for s in run}
    caption = [
        f"{trace.name} · overview · {len(subgraphs)} subgraphs"
        + (f" in {len(runs)} runs of identical subgraphs" if collapse else ""),
        "An edge ends at the last subgraph that reads its values: there the cache drops them.",
    ]
    legend = [
        (COLORS["input"], "model input"),
        (COLORS["ancestor"], "subgraph without a target"),
        (COLORS["target"], "subgraph with sequential targets"),
        (COLORS["plain"], "solid edge: read by the next subgraph only"),
        (COLORS["skip_swatch"], "dashed edge: kept in the cache, read later"),
    ]
    dot = new_digraph("overview", caption_label(caption, legend))
    nodes: dict[str, NodeInfo] = {}
    flows = handoffs(subgraphs)
    for name in dict.fromkeys(f.name for f in flows if f.producer is None):
        node_id = safe_id("in-", name)
        dot.node(
            node_id,
            html_label(name, ["model input"]),
            id=node_id,
            shape="ellipse",
            fillcolor=COLORS["input"],
        )
        fields = node_fields(graph_nodes[name]) if name in graph_nodes else [("name", name)]
        nodes[node_id] = NodeInfo(name, tuple(fields))
    for run in runs:
        node_id = run_id(run)
        title, lines, fields = _box_text(trace, run, run[-1] is subgraphs[-1])
        dot.node(
            node_id,
            html_label(title, lines),
            id=node_id,
            fillcolor=COLORS["target"] if run[0].targets else COLORS["ancestor"],
        )
        nodes[node_id] = NodeInfo(title, tuple(fields), run[0].index)
    _draw_edges(dot, flows, box_of, graph_nodes, subgraphs[0].index)
    return Drawing(
        view="overview",
        title=f"{trace.name} · overview",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={s.index: SubgraphInfo.of(s) for s in subgraphs},
    )


def _box_text(
    trace: TracedModel, run: Sequence[Subgraph], returns_output: bool
) -> tuple[str, list[str], list[tuple[str, str]]]:
    """Title, label lines and panel facts of the box for one run of subgraphs."""
    summaries = {s.index: s for s in trace.summaries}
    first, last = run[0], run[-1]
    targets = [t for s in run for t in s.targets]
    classes = list(dict.fromkeys(type(trace.model.get_submodule(t)).__name__ for t in targets))
    params = [summaries[s.index].parameter_bytes for s in run]
    nodes_each = [s.num_nodes for s in run]
    if len(run) == 1:
        title = f"#{first.index} · {', '.join(first.targets) or 'head (before the first target)'}"
        lines = [
            ", ".join(classes),
            f"{plural(first.num_nodes, 'node')} · parameters {human_bytes(params[0])}",
        ]
    else:
        title = f"#{first.index}–{last.index} ×{len(run)} · {targets[0]} … {targets[-1]}"
        lines = [
            ", ".join(classes),
            (
                f"{plural(nodes_each[0], 'node')} each · parameters "
                f"{human_bytes(params[0])} each, {human_bytes(sum(params))} in all"
            ),
        ]
    if returns_output:
        lines.append("returns the model output")
    fields = [
        ("subgraphs", index_ranges(s.index for s in run)),
        ("targets", ", ".join(targets) or "—"),
        ("target classes", ", ".join(classes) or "—"),
        (
            "nodes",
            " + ".join(str(n) for n in nodes_each) if len(run) <= 4 else str(sum(nodes_each)),
        ),
        ("parameters", human_bytes(sum(params))),
        ("outputs", human_bytes(sum(summaries[s.index].output_bytes for s in run))),
    ]
    return title, lines, fields


def _draw_edges(
    dot: graphviz.Digraph,
    flows: list[Handoff],
    box_of: dict[int, str],
    graph_nodes: dict[str, fx.Node],
    first_index: int,
) -> None:
    """Merge hand-offs that share their ends and style into one labelled edge each."""
    merged: dict[tuple[str, str, bool], list[Handoff]] = {}
    for flow in flows:
        tail = safe_id("in-", flow.name) if flow.producer is None else box_of[flow.producer]
        head = box_of[flow.readers[-1]]
        if tail == head:
            continue  # handed on inside a collapsed run (runs are contiguous)
        merged.setdefault((tail, head, flow.skips(first_index)), []).append(flow)
    for (tail, head, skip), group in merged.items():
        lines: list[str] = []
        for flow in group:
            value = graph_nodes[flow.name].meta.get("val") if flow.name in graph_nodes else None
            size = _bytes_of(graph_nodes.get(flow.name))
            lines.append(f"{flow.name}: {describe_value(value)} · {size}")
            if skip:
                dropped = f" · dropped after #{flow.readers[-1]}" if flow.dropped else ""
                lines.append(f"   read by {index_ranges(flow.readers)}{dropped}")
        style = (
            {
                "style": "dashed",
                "color": COLORS["skip"],
                "fontcolor": COLORS["skip"],
                "penwidth": "1.6",
                "constraint": "false",
            }
            if skip
            else {}
        )
        dot.edge(tail, head, label=table_label(lines), **style)


def _bytes_of(node: fx.Node | None) -> str:
    return human_bytes(value_bytes(node.meta.get("val"))) if node is not None else "?"
