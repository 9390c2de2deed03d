"""The detail view: every operation of chosen subgraphs, clustered by subgraph and module.

Values a drawn subgraph reads from elsewhere (model inputs, attributes, subgraphs not drawn)
appear as yellow ellipses inside its box, so each box shows the subgraph's whole interface.
A value read by several subgraphs (the attention mask, the rotary tables) is such an ellipse
in each reader's box too, even when its writer is drawn: one edge from the head to every layer
would pull all layers onto one row (Graphviz ranks them together) and make the picture as
wide as the model is deep. On a deep model each run of identical layers is drawn once,
labelled with what it stands for; ``expand`` draws every subgraph.
"""

from __future__ import annotations

from collections.abc import Sequence

import graphviz
from torch import fx

from llmc_trace.errors import BadInputError
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.render.drawing import (
    COLORS,
    Drawing,
    NodeInfo,
    SubgraphInfo,
    caption_label,
    cluster,
    html_label,
    new_digraph,
)
from llmc_trace.render.fold import fold_layers
from llmc_trace.core.markup import safe_id
from llmc_trace.render.labels import describe_value, index_ranges, node_fields
from llmc_trace.render.nodes import default_style, draw_clustered, fx_node_id
from llmc_trace.render.overview import handoffs
from llmc_trace.traced.model import TracedModel


def owners(subgraphs: Sequence[Subgraph], graph: fx.Graph) -> dict[str, int]:
    """Subgraph index of every operation, by node name (copies keep their original names).

    The model's output node belongs to the last subgraph; placeholders and attribute reads
    belong to none (every subgraph reads them).
    """
    owner = {
        node.name: subgraph.index
        for subgraph in subgraphs
        for node in subgraph.graph.nodes
        if node.op not in ("placeholder", "get_attr", "output")
    }
    owner.update({node.name: subgraphs[-1].index for node in graph.nodes if node.op == "output"})
    return owner


def check_indices(indices: Sequence[int], subgraphs: Sequence[Subgraph]) -> None:
    """Raise :class:`BadInputError` for indices the partition does not have."""
    known = {s.index for s in subgraphs}
    unknown = [i for i in indices if i not in known]
    if unknown:
        raise BadInputError(
            f"Subgraph {', '.join(map(str, unknown))} does not exist.",
            hint=f"This model has {len(subgraphs)} subgraphs, numbered "
            f"{index_ranges(known).replace('#', '')}; see `llmc-trace render --view overview`.",
            param="subgraphs",
        )


def chosen_subgraphs(
    trace: TracedModel, indices: Sequence[int] | None, expand: bool
) -> list[tuple[Subgraph, list[Subgraph]]]:
    """The subgraphs to draw, each with the identical ones it stands for when folded."""
    wanted = set(indices) if indices is not None else {s.index for s in trace.subgraphs}
    subgraphs = [s for s in trace.subgraphs if s.index in wanted]
    return [
        (subgraph, [layer.subgraphs[position] for layer in run])
        for run in fold_layers(trace, subgraphs, expand)
        for position, subgraph in enumerate(run[0].subgraphs)
    ]


class Operations:
    """Draws subgraphs' operations, each subgraph with references to what it reads.

    ``drawn`` holds the indices of every subgraph the picture shows: a value written by one
    of them and read by no other subgraph is an edge from its writer; anything else a
    subgraph reads is a reference ellipse in that subgraph's box (see the module docstring).
    Side-panel facts of every drawn node go to ``nodes``.
    """

    def __init__(self, trace: TracedModel, drawn: set[int], nodes: dict[str, NodeInfo]) -> None:
        assert trace.partitioned is not None, "operations need a traced model"
        self.trace, self.drawn, self.nodes = trace, drawn, nodes
        self.owner = owners(trace.partitioned.subgraphs, trace.partitioned.trace.graph)
        self.shared = {f.name for f in handoffs(trace.partitioned.subgraphs) if f.shared}
        self.references: dict[tuple[int, str], str] = {}
        self.parts: dict[int, list[fx.Node]] = {}
        for node in trace.partitioned.trace.graph.nodes:
            if node.name in self.owner:
                self.parts.setdefault(self.owner[node.name], []).append(node)

    def operations(self, subgraph: Subgraph) -> list[fx.Node]:
        """The whole graph's nodes that ``subgraph`` runs, in graph order."""
        return self.parts.get(subgraph.index, [])

    def draw(self, container: graphviz.Digraph, subgraph: Subgraph) -> list[fx.Node]:
        """Add ``subgraph``'s operations and references to ``container``; returns the
        operations, for :meth:`draw_edges`."""
        part = self.operations(subgraph)
        for node in part:
            for used in node.all_input_nodes:
                if self._is_reference(used, subgraph.index):
                    self._reference(container, used, subgraph.index)
        draw_clustered(
            container,
            part,
            self.trace.model,
            lambda n: default_style(n, self.trace.leaves),
            f"sg{subgraph.index}",
            self.nodes,
            lambda n: self.owner.get(n.name),
        )
        return part

    def draw_edges(self, dot: graphviz.Digraph, part: Sequence[fx.Node]) -> None:
        """One edge per (input, user) pair of the operations in ``part``."""
        for node in part:
            reader = self.owner[node.name]
            for used in dict.fromkeys(node.all_input_nodes):
                if self._is_reference(used, reader):
                    tail = self.references[(reader, self._key(used))]
                else:
                    tail = fx_node_id(used)
                dot.edge(tail, fx_node_id(node))

    def stack(
        self, dot: graphviz.Digraph, above: Sequence[fx.Node], below: Sequence[fx.Node]
    ) -> None:
        """Keep the subgraph of ``below`` under that of ``above`` with invisible edges from
        the first's sinks to the second's sources (drawn subgraphs need not be connected)."""
        inside = {n.name for n in above}
        sinks = [n for n in above if not any(u.name in inside for u in n.users)]
        reader = self.owner[below[0].name]
        sources = [i for (r, _), i in self.references.items() if r == reader]
        sources += [fx_node_id(n) for n in below if not n.all_input_nodes]
        for sink in sinks:
            for source in sources:
                dot.edge(fx_node_id(sink), source, style="invis")

    def _is_reference(self, used: fx.Node, reader: int) -> bool:
        writer = self.owner.get(used.name)
        if writer == reader:
            return False
        return writer not in self.drawn or used.name in self.shared

    @staticmethod
    def _key(used: fx.Node) -> str:
        # subgraphs copy attribute reads, so the trace may read one attribute through several
        # nodes: one reference per attribute
        return f"a:{used.target}" if used.op == "get_attr" else used.name

    def _reference(self, container: graphviz.Digraph, used: fx.Node, reader: int) -> None:
        key = self._key(used)
        if (reader, key) in self.references:
            return
        writer = self.owner.get(used.name)
        if used.op == "get_attr":
            node_id = safe_id(f"sg{reader}-a-", str(used.target))
            title, where = str(used.target), "attribute of the model"
        else:
            node_id, title = safe_id(f"sg{reader}-x-", used.name), used.name
            where = "model input" if used.op == "placeholder" else f"output of subgraph #{writer}"
            if used.name in self.shared:
                where += " · shared"
        self.references[(reader, key)] = node_id
        value = [describe_value(used.meta["val"])] if "val" in used.meta else []
        container.node(
            node_id,
            html_label(title, [where, *value], title_size=10),
            id=node_id,
            shape="ellipse",
            fillcolor=COLORS["input"],
        )
        self.nodes[node_id] = NodeInfo(title, (*node_fields(used), ("comes from", where)), writer)


def draw_detail(
    trace: TracedModel, indices: Sequence[int] | None = None, expand: bool = False
) -> Drawing:
    """The detail view of ``indices`` (default: every subgraph); see the module docstring."""
    assert trace.partitioned is not None, "the detail view needs a traced model"
    subgraphs = trace.partitioned.subgraphs
    if indices is not None:
        check_indices(indices, subgraphs)
    chosen = chosen_subgraphs(trace, indices, expand)
    nodes: dict[str, NodeInfo] = {}
    operations = Operations(trace, {s.index for s, _ in chosen}, nodes)
    count = sum(len(operations.operations(s)) for s, _ in chosen)
    caption = [
        (
            f"{trace.name} · detail of subgraph{'s' if len(chosen) > 1 else ''} "
            f"{index_ranges(s.index for s, _ in chosen)} · {count} operations"
        ),
        "Boxes are operations (value shape below); 3D boxes are modules called as a whole.",
    ]
    if any(len(members) > 1 for _, members in chosen):
        caption.append("Each run of identical layers is drawn once; expand draws every one.")
    legend = [
        (COLORS["input"], "read from outside the subgraph"),
        (COLORS["target"], "sequential target"),
        (COLORS["ignored"], "ignored module"),
        (COLORS["leaf"], "module holding no target"),
    ]
    dot = new_digraph("detail", caption_label(caption, legend))
    parts: list[list[fx.Node]] = []
    for subgraph, members in chosen:
        with cluster(dot, f"cluster_sg{subgraph.index}") as box:
            repeats = (
                f" · stands for {index_ranges(m.index for m in members)}"
                if len(members) > 1
                else ""
            )
            box.attr(
                label=f"#{subgraph.index} · {', '.join(subgraph.targets) or 'head'}{repeats}",
                style="rounded",
                color="#1565c0",
                fontsize="11",
                labeljust="l",
            )
            parts.append(operations.draw(box, subgraph))
    operations.draw_edges(dot, [node for part in parts for node in part])
    for above, below in zip(parts, parts[1:]):
        operations.stack(dot, above, below)
    return Drawing(
        view="detail",
        title=f"{trace.name} · detail",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={s.index: SubgraphInfo.of(s) for s in subgraphs},
    )
