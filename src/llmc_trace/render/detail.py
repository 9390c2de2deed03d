"""The detail view: every operation of chosen subgraphs, clustered by subgraph and module.

Values a drawn subgraph reads from elsewhere (model inputs, attributes, subgraphs not drawn)
appear once each as yellow ellipses, so the picture shows a subgraph's whole interface. With
``collapse``, each run of identical subgraphs is drawn once, labelled with its repeats.
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
    html_label,
    new_digraph,
)
from llmc_trace.render.labels import describe_value, index_ranges, node_fields, safe_id
from llmc_trace.render.nodes import default_style, draw_clustered, draw_edges, fx_node_id
from llmc_trace.render.overview import runs_of_equal_subgraphs
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
    subgraphs: Sequence[Subgraph], indices: Sequence[int] | None, collapse: bool
) -> list[tuple[Subgraph, list[Subgraph]]]:
    """The subgraphs to draw, each with the identical ones it stands for under ``collapse``."""
    wanted = set(indices) if indices is not None else {s.index for s in subgraphs}
    chosen = []
    for run in runs_of_equal_subgraphs(subgraphs, collapse):
        members = [s for s in run if s.index in wanted]
        if members:
            chosen.append((members[0], members))
    return chosen


def draw_detail(
    trace: TracedModel, indices: Sequence[int] | None = None, collapse: bool = False
) -> Drawing:
    """The detail view of ``indices`` (default: every subgraph); see the module docstring."""
    assert trace.partitioned is not None, "the detail view needs a traced model"
    subgraphs = trace.partitioned.subgraphs
    if indices is not None:
        check_indices(indices, subgraphs)
    owner = owners(subgraphs, trace.partitioned.trace.graph)
    chosen = chosen_subgraphs(subgraphs, indices, collapse)
    drawn_indices = {s.index for s, _ in chosen}
    graph_nodes = [
        n for n in trace.partitioned.trace.graph.nodes if owner.get(n.name) in drawn_indices
    ]
    caption = [
        (
            f"{trace.name} · detail of subgraph{'s' if len(chosen) > 1 else ''} "
            f"{index_ranges(s.index for s, _ in chosen)} · {len(graph_nodes)} operations"
        ),
        "Boxes are operations (value shape below); 3D boxes are modules called as a whole.",
    ]
    legend = [
        (COLORS["input"], "read from outside the drawn subgraphs"),
        (COLORS["target"], "sequential target"),
        (COLORS["ignored"], "ignored module"),
        (COLORS["leaf"], "module holding no target"),
    ]
    dot = new_digraph("detail", caption_label(caption, legend))
    nodes: dict[str, NodeInfo] = {}
    external = _draw_external(dot, graph_nodes, owner, nodes)
    for subgraph, members in chosen:
        part = [n for n in graph_nodes if owner[n.name] == subgraph.index]
        with dot.subgraph(name=f"cluster_sg{subgraph.index}") as cluster:
            repeats = (
                f" · stands for {index_ranges(m.index for m in members)}"
                if len(members) > 1
                else ""
            )
            cluster.attr(
                label=f"#{subgraph.index} · {', '.join(subgraph.targets) or 'head'}{repeats}",
                style="rounded",
                color="#1565c0",
                fontsize="11",
                labeljust="l",
            )
            draw_clustered(
                cluster,
                part,
                trace.model,
                lambda n: default_style(n, trace.leaves),
                f"sg{subgraph.index}",
                nodes,
                lambda n: owner.get(n.name),
            )
    drawn = {n.name for n in graph_nodes}

    def id_of(node: fx.Node) -> str | None:
        return fx_node_id(node) if node.name in drawn else external.get(node.name)

    draw_edges(dot, graph_nodes, id_of)
    return Drawing(
        view="detail",
        title=f"{trace.name} · detail",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={s.index: SubgraphInfo.of(s) for s in subgraphs},
    )


def _draw_external(
    dot: graphviz.Digraph,
    graph_nodes: list[fx.Node],
    owner: dict[str, int],
    infos: dict[str, NodeInfo],
) -> dict[str, str]:
    """One ellipse per value the drawn nodes read from outside them; returns name -> id.

    Attribute reads are drawn once per attribute, as subgraphs copy them (the trace may
    read the same attribute through several nodes).
    """
    drawn = {n.name for n in graph_nodes}
    external: dict[str, str] = {}
    for node in graph_nodes:
        for used in node.all_input_nodes:
            if used.name in drawn or used.name in external:
                continue
            if used.op == "get_attr":
                node_id, title, where = (
                    safe_id("a-", str(used.target)),
                    str(used.target),
                    "attribute of the model",
                )
            else:
                node_id, title = safe_id("x-", used.name), used.name
                where = (
                    "model input"
                    if used.op == "placeholder"
                    else f"output of subgraph #{owner.get(used.name, '?')}"
                )
            external[used.name] = node_id
            if node_id in infos:
                continue
            lines = [where, describe_value(used.meta.get("val"))] if "val" in used.meta else [where]
            dot.node(
                node_id,
                html_label(title, lines, title_size=10),
                id=node_id,
                shape="ellipse",
                fillcolor=COLORS["input"],
            )
            infos[node_id] = NodeInfo(
                title, (*node_fields(used), ("comes from", where)), owner.get(used.name)
            )
    return external
