"""Draw torch.fx nodes as graphviz nodes, nested in one cluster per module that ran them.

Shared by the detail and failure views. A leaf module call (``call_module``) is one node placed
in the cluster of the module that *called* it, so a decoder layer is a box inside
``model.layers``, not a cluster of its own with nothing traced inside.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import graphviz
import torch
from torch import fx

from llmc_trace.render.drawing import COLORS, NodeInfo, cluster, html_label
from llmc_trace.core.markup import safe_id
from llmc_trace.render.labels import describe_value, node_fields, node_operation
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_TARGET, LeafPlan

#: ``style(node) -> graphviz attributes`` overriding the default look of a node.
NodeStyle = Callable[[fx.Node], dict[str, str]]


def fx_node_id(node: fx.Node) -> str:
    return safe_id("n-", node.name)


def cluster_path(node: fx.Node) -> str:
    """The module whose cluster holds ``node``: for a leaf call, the caller."""
    if node.op == "call_module":
        return str(node.target).rpartition(".")[0]
    return str(node.meta.get("module_path") or "")


def default_style(node: fx.Node, plan: LeafPlan) -> dict[str, str]:
    """Leaf calls are 3D boxes coloured by why they are leaves; inputs are yellow ellipses."""
    if node.op == "call_module":
        reason = plan.leaf_reason(str(node.target))
        fill = {LEAF_TARGET: COLORS["target"], LEAF_IGNORED: COLORS["ignored"]}.get(
            reason or "", COLORS["leaf"]
        )
        return {"fillcolor": fill, "shape": "box3d", "style": "filled"}
    if node.op in ("placeholder", "get_attr"):
        return {"fillcolor": COLORS["input"], "shape": "ellipse"}
    if node.op == "output":
        return {"shape": "doubleoctagon"}
    return {}


def node_label(node: fx.Node) -> str:
    lines = [describe_value(node.meta.get("val"))] if "val" in node.meta else []
    operation = node_operation(node)
    if operation != node.name:
        lines.append(node.name)
    return html_label(operation, lines, title_size=10)


def draw_clustered(
    container: graphviz.Digraph,
    nodes: Sequence[fx.Node],
    model: torch.nn.Module,
    style: NodeStyle,
    scope: str,
    infos: dict[str, NodeInfo],
    subgraph_of: Callable[[fx.Node], int | None] = lambda node: None,
    highlighted: Collection[str] = (),
) -> None:
    """Add ``nodes`` (in graph order) to ``container`` inside nested module clusters.

    ``scope`` keeps cluster names unique when the same module appears in several places
    (the detail view draws one cluster tree per subgraph). Clusters of the module paths in
    ``highlighted`` get a red border. Each node's panel facts go to ``infos``.
    """
    groups: dict[str, list[fx.Node]] = {}
    for node in nodes:
        groups.setdefault(cluster_path(node), []).append(node)
    children: dict[str, list[str]] = {}
    for path in groups:
        if path:
            children.setdefault(_enclosing(path, groups), []).append(path)
    classes = {str(n.meta.get("module_path")): str(n.meta.get("module_class") or "") for n in nodes}

    def emit(into: graphviz.Digraph, path: str) -> None:
        for node in groups.get(path, []):
            node_id = fx_node_id(node)
            into.node(node_id, node_label(node), id=node_id, **style(node))
            infos[node_id] = NodeInfo(node.name, tuple(node_fields(node)), subgraph_of(node))
        for child in children.get(path, []):
            with cluster(into, safe_id(f"cluster_{scope}_", child)) as box:
                label = f"{child} · {_class_of(model, child, classes)}".rstrip(" ·")
                box.attr(
                    label=label,
                    style="rounded,dashed",
                    color=COLORS["failure"] if child in highlighted else "#9e9e9e",
                    fontsize="10",
                    labeljust="l",
                )
                emit(box, child)

    emit(container, "")


def draw_edges(
    dot: graphviz.Digraph,
    nodes: Sequence[fx.Node],
    id_of: Callable[[fx.Node], str | None],
    style: Callable[[fx.Node, fx.Node], dict[str, str]] = lambda used, user: {},
) -> None:
    """One edge per (input, user) pair among ``nodes``; ``id_of`` maps inputs drawn elsewhere."""
    for node in nodes:
        head = id_of(node)
        for used in dict.fromkeys(node.all_input_nodes):
            tail = id_of(used)
            if tail is not None and head is not None:
                dot.edge(tail, head, **style(used, node))


def _enclosing(path: str, groups: dict[str, list[fx.Node]]) -> str:
    """The nearest drawn ancestor cluster of ``path`` (``""``: the top level)."""
    parent = path
    while parent:
        parent = parent.rpartition(".")[0]
        if parent in groups:
            return parent
    return ""


def _class_of(model: torch.nn.Module, path: str, recorded: dict[str, str]) -> str:
    try:
        return type(model.get_submodule(path)).__name__
    except AttributeError:  # a module built during forward has no path on the model
        return recorded.get(path, "")
