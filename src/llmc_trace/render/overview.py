"""The overview: one box per subgraph, and the values handed between subgraphs.

This is the picture of the sequential pipeline's intermediates cache. A value read by one
subgraph is an edge from the subgraph that writes it to that reader, where the cache drops it
(its ``consumed_names``); the edge is dashed when the value waits past the next subgraph. A
value read by several subgraphs (the attention mask, the rotary tables, the position ids) is
drawn once, as a *shared value* beside its writer, with one dashed edge to the last reader,
where the cache drops it: one edge per reader would tie every layer to the head and make the
picture as wide as it is tall. Values with the same ends are merged into one edge or node.

On a deep model, runs of identical layers (:mod:`~llmc_trace.render.fold`) become one box, so
an 80-layer model reads like a 3-layer one; ``expand`` draws every subgraph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import graphviz
from torch import fx

from llmc_trace.core.sizes import value_bytes
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
from llmc_trace.render.fold import Layer, fold_layers, path_range
from llmc_trace.core.markup import plural, safe_id
from llmc_trace.render.labels import (
    describe_value,
    human_bytes,
    index_ranges,
    node_fields,
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

    @property
    def shared(self) -> bool:
        """Read by several subgraphs: drawn once, not as one edge per reader."""
        return len(self.readers) > 1


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


@dataclass(frozen=True)
class Values:
    """The values crossing subgraph boundaries, and the graph nodes holding them, found
    once per trace: the page draws a chain for every folded run from the same ones."""

    flows: list[Handoff]
    nodes: dict[str, fx.Node]

    @classmethod
    def of(cls, trace: TracedModel) -> Values:
        assert trace.partitioned is not None, "values need a traced model"
        graph = trace.partitioned.trace.graph
        return cls(handoffs(trace.subgraphs), {node.name: node for node in graph.nodes})


@dataclass(frozen=True)
class Box:
    """One box of the overview: a subgraph, one layer's subgraphs, or a folded run of layers."""

    layers: tuple[Layer, ...]

    @property
    def subgraphs(self) -> list[Subgraph]:
        return [s for layer in self.layers for s in layer.subgraphs]

    @property
    def folded(self) -> bool:
        return len(self.layers) > 1

    @property
    def id(self) -> str:
        first, last = self.subgraphs[0].index, self.subgraphs[-1].index
        return safe_id("sg-", str(first) if first == last else f"{first}-{last}")


def overview_boxes(trace: TracedModel, expand: bool = False) -> list[Box]:
    """The boxes of the overview in order: folded runs, else one box per subgraph."""
    boxes: list[Box] = []
    for run in fold_layers(trace, trace.subgraphs, expand):
        if len(run) > 1:
            boxes.append(Box(tuple(run)))
        else:
            boxes += [Box((Layer(run[0].path, (s,)),)) for s in run[0].subgraphs]
    return boxes


def draw_overview(trace: TracedModel, expand: bool = False) -> Drawing:
    """The overview of a traced model; see the module docstring."""
    assert trace.partitioned is not None, "the overview needs a traced model"
    subgraphs = trace.partitioned.subgraphs
    boxes = overview_boxes(trace, expand)
    folded = sum(1 for box in boxes if box.folded)
    caption = [
        f"{trace.name} · overview · {len(subgraphs)} subgraphs"
        + (f", runs of identical layers drawn once ({plural(folded, 'run')})" if folded else ""),
        "An edge ends at the last subgraph that reads its values: there the cache drops them.",
    ]
    legend = [
        (COLORS["input"], "model input"),
        (COLORS["ancestor"], "subgraph without a target"),
        (COLORS["target"], "subgraph with sequential targets"),
        (COLORS["plain"], "solid edge: read by the next subgraph only"),
        (COLORS["skip_swatch"], "shared or dashed: kept in the cache, read later"),
    ]
    dot = new_digraph("overview", caption_label(caption, legend))
    nodes: dict[str, NodeInfo] = {}
    values = Values.of(trace)
    graph_nodes = values.nodes
    box_of = {s.index: box.id for box in boxes for s in box.subgraphs}
    for name in dict.fromkeys(f.name for f in values.flows if f.producer is None):
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
    for box in boxes:
        draw_box(dot, trace, box, nodes)
    _draw_flows(dot, values.flows, box_of, graph_nodes, subgraphs[0].index, nodes)
    return Drawing(
        view="overview",
        title=f"{trace.name} · overview",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={s.index: SubgraphInfo.of(s) for s in subgraphs},
    )


def draw_chain(
    trace: TracedModel, boxes: Sequence[Box], values: Values, nodes: dict[str, NodeInfo]
) -> str:
    """DOT of ``boxes`` alone, each handing its values to the next: a run unfolded.

    Values from outside the boxes and shared values are drawn where the run is (the
    overview), so only the hand-offs between the boxes are edges here.
    """
    dot = new_digraph("chain", "")
    box_of = {s.index: box.id for box in boxes for s in box.subgraphs}
    for box in boxes:
        draw_box(dot, trace, box, nodes)
    inside = [
        flow
        for flow in values.flows
        if flow.producer in box_of and not flow.shared and flow.readers[0] in box_of
    ]
    _draw_flows(dot, inside, box_of, values.nodes, boxes[0].subgraphs[0].index, nodes)
    return dot.source


def draw_box(
    dot: graphviz.Digraph, trace: TracedModel, box: Box, nodes: dict[str, NodeInfo]
) -> None:
    """Add ``box`` to ``dot`` with its side-panel facts."""
    title, lines, fields = _box_text(trace, box)
    subgraphs = box.subgraphs
    dot.node(
        box.id,
        html_label(title, lines),
        id=box.id,
        fillcolor=COLORS["target"] if subgraphs[0].targets else COLORS["ancestor"],
    )
    nodes[box.id] = NodeInfo(title, tuple(fields), subgraphs[0].index)


def box_title(box: Box) -> str:
    """``#5 · model.layers.4``, ``#8–14 · model.layers.1`` or ``#1–79 · model.layers.0–78 ×79``."""
    subgraphs = box.subgraphs
    indices = index_ranges(s.index for s in subgraphs)
    if box.folded:
        paths = [layer.path or "" for layer in box.layers]
        return f"{indices} · {path_range(paths[0], paths[-1])} ×{len(box.layers)}"
    if len(subgraphs) > 1:
        return f"{indices} · {box.layers[0].path}"
    return f"{indices} · {', '.join(subgraphs[0].targets) or 'head (before the first target)'}"


def _box_text(trace: TracedModel, box: Box) -> tuple[str, list[str], list[tuple[str, str]]]:
    """Title, label lines and panel facts of one box."""
    summaries = {s.index: s for s in trace.summaries}
    subgraphs = box.subgraphs
    targets = [t for s in subgraphs for t in s.targets]
    classes = list(dict.fromkeys(type(trace.model.get_submodule(t)).__name__ for t in targets))
    params = sum(summaries[s.index].parameter_bytes for s in subgraphs)
    num_nodes = sum(s.num_nodes for s in subgraphs)
    count = len(box.layers)
    each = " each" if box.folded else ""
    lines = [
        ", ".join(classes),
        (
            f"{plural(num_nodes // count, 'node')}{each} · parameters "
            f"{human_bytes(params / count)}{each}"
            + (f", {human_bytes(params)} in all" if box.folded else "")
        ),
    ]
    if len(subgraphs) > count:
        lines.insert(1, f"{plural(len(subgraphs) // count, 'subgraph')}{each}")
    if subgraphs[-1] is trace.subgraphs[-1]:
        lines.append("returns the model output")
    fields = [
        ("subgraphs", index_ranges(s.index for s in subgraphs)),
        ("targets", _targets_text(targets)),
        ("target classes", ", ".join(classes) or "—"),
        ("nodes", str(num_nodes)),
        ("parameters", human_bytes(params)),
        ("outputs", human_bytes(sum(summaries[s.index].output_bytes for s in subgraphs))),
    ]
    if box.folded:
        fields.insert(0, ("stands for", f"{count} identical layers"))
    return box_title(box), lines, fields


def _targets_text(targets: Sequence[str]) -> str:
    if len(targets) > 4:
        return f"{len(targets)} targets, {targets[0]} … {targets[-1]}"
    return ", ".join(targets) or "—"


def _draw_flows(
    dot: graphviz.Digraph,
    flows: list[Handoff],
    box_of: dict[int, str],
    graph_nodes: dict[str, fx.Node],
    first_index: int,
    nodes: dict[str, NodeInfo],
) -> None:
    """Values read once become edges (merged by ends and style); shared values become one
    node per writer and set of readers, with one edge in and one dashed edge to the last
    reader."""
    edges: dict[tuple[str, str, bool], list[Handoff]] = {}
    shared: dict[tuple[str | None, tuple[str, ...]], list[Handoff]] = {}
    for flow in flows:
        tail = safe_id("in-", flow.name) if flow.producer is None else box_of[flow.producer]
        heads = tuple(dict.fromkeys(box_of[r] for r in flow.readers))
        if heads == (tail,):
            continue  # handed on inside a folded run (runs are contiguous)
        if flow.shared and flow.producer is not None:
            shared.setdefault((tail, heads), []).append(flow)
        else:
            edges.setdefault((tail, heads[-1], flow.skips(first_index)), []).append(flow)
    for (tail, head, skip), group in edges.items():
        lines: list[str] = []
        for flow in group:
            lines.append(_value_line(flow, graph_nodes))
            if skip:
                lines.append(f"   {_lifetime(flow)}")
        dot.edge(tail, head, label=table_label(lines), **(_KEPT if skip else {}))
    for (tail, heads), group in shared.items():
        node_id = safe_id("v-", group[0].name)
        lines = [_value_line(flow, graph_nodes) for flow in group]
        lifetime = _lifetime(group[0])
        dot.node(
            node_id,
            table_label(["shared values", *lines, lifetime]),
            id=node_id,
            shape="note",
            style="filled",
            fillcolor=COLORS["skip_swatch"],
            color=COLORS["skip"],
        )
        nodes[node_id] = NodeInfo(
            ", ".join(flow.name for flow in group),
            (
                ("values", ", ".join(flow.name for flow in group)),
                ("written by", f"#{group[0].producer}"),
                ("read by", index_ranges(group[0].readers)),
                ("kept", lifetime),
            ),
            group[0].producer,
        )
        dot.edge(tail, node_id, color=COLORS["skip"])
        dot.edge(node_id, heads[-1], **_KEPT)


#: The look of an edge whose values wait in the cache past the next subgraph.
_KEPT = {
    "style": "dashed",
    "color": COLORS["skip"],
    "fontcolor": COLORS["skip"],
    "penwidth": "1.6",
    "constraint": "false",
}


def _value_line(flow: Handoff, graph_nodes: dict[str, fx.Node]) -> str:
    node = graph_nodes.get(flow.name)
    value = node.meta.get("val") if node is not None else None
    size = human_bytes(value_bytes(value)) if node is not None else "?"
    return f"{flow.name}: {describe_value(value)} · {size}"


def _lifetime(flow: Handoff) -> str:
    dropped = f" · dropped after #{flow.readers[-1]}" if flow.dropped else ""
    return f"read by {index_ranges(flow.readers)}{dropped}"
