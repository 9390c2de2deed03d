"""The modules view: the module tree coloured by what tracing does with each module.

This is the picture behind choosing sequential targets and modules to ignore. Tracing walks
*into* the ancestors of the sequential targets (blue) and records every other module it meets
as one opaque call: the targets themselves (green), ignored modules (orange), and modules
that hold no target (purple). Nothing inside those is traced (grey), so untraceable code there
does no harm; untraceable code in a blue module is what ``--ignore`` or a different target
choice must move into a leaf. Where tracing failed, the modules on the failure's stack are
outlined in red.

With ``collapse``, consecutive siblings with identical subtrees (the decoder layers) are drawn
once, labelled with how many they stand for.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import graphviz
import torch

from llmc_trace.render.drawing import (
    COLORS,
    Drawing,
    NodeInfo,
    SubgraphInfo,
    caption_label,
    html_label,
    new_digraph,
)
from llmc_trace.render.labels import human_bytes, safe_id
from llmc_trace.render.trace import RenderTrace
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET, LEAF_TARGET, LeafPlan

#: Role -> (colour key, sentence shown in the legend and the side panel).
ROLES: dict[str, tuple[str, str]] = {
    "target": ("target", LEAF_TARGET),
    "ignored": ("ignored", LEAF_IGNORED),
    "ancestor": ("ancestor", "traced through (holds a sequential target)"),
    "leaf": ("leaf", f"leaf: {LEAF_NO_TARGET}"),
    "inside": ("inside", "inside a leaf, not traced"),
}


def module_role(plan: LeafPlan, path: str) -> str:
    """One of :data:`ROLES`: what tracing does with the module at ``path``."""
    reason = plan.leaf_reason(path)
    if reason == LEAF_TARGET:
        return "target"
    if reason == LEAF_IGNORED:
        return "ignored"
    if reason is None:
        return "ancestor"
    parent = path.rpartition(".")[0]
    return "leaf" if plan.leaf_reason(parent) is None else "inside"


def subtree_signature(
    model: torch.nn.Module, plan: LeafPlan, path: str, marked: Collection[str] = ()
) -> tuple[str, ...]:
    """Classes, relative paths and roles below ``path``: equal for interchangeable layers.

    A module in ``marked`` (the failure's stack) never looks like its siblings, so
    collapsing cannot hide it.
    """
    signature = []
    for name, sub in model.get_submodule(path).named_modules():
        full = f"{path}.{name}" if name else path
        mark = "!" if full in marked else ""
        signature.append(f"{name}:{type(sub).__name__}:{module_role(plan, full)}{mark}")
    return tuple(signature)


def draw_modules(trace: RenderTrace, collapse: bool = False) -> Drawing:
    """The modules view of a model, traced or not; see the module docstring."""
    model, plan = trace.model, trace.leaves
    failed = [path for path, _ in trace.failure.module_stack] if trace.failure else []
    subgraph_of = _subgraph_of_modules(trace)
    caption = [
        (
            f"{trace.name} · modules · {len(plan.targets)} sequential targets, "
            f"{len(plan.ignored)} ignored"
        ),
        "Tracing walks into blue modules only; each other coloured module is one call in the graph.",
    ]
    if failed:
        caption.append(
            f"Red outline: the modules tracing was inside when it failed ({failed[-1]})."
        )
    legend = [(COLORS[color], text) for color, text in ROLES.values()]
    dot = new_digraph("modules", caption_label(caption, legend), rankdir="LR")
    dot.attr("graph", ranksep="0.5")
    nodes: dict[str, NodeInfo] = {}
    _draw_subtree(dot, model, plan, "", "", 1, collapse, failed, subgraph_of, nodes)
    return Drawing(
        view="modules",
        title=f"{trace.name} · modules",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={}
        if trace.partitioned is None
        else {s.index: SubgraphInfo.of(s) for s in trace.partitioned.subgraphs},
    )


def _draw_subtree(
    dot: graphviz.Digraph,
    model: torch.nn.Module,
    plan: LeafPlan,
    path: str,
    parent_id: str,
    repeats: int,
    collapse: bool,
    failed: Sequence[str],
    subgraph_of: dict[str, int],
    nodes: dict[str, NodeInfo],
) -> None:
    """Draw the module at ``path`` (standing for ``repeats`` identical siblings) and below."""
    module = model.get_submodule(path)
    role = module_role(plan, path)
    node_id = safe_id("m-", path or "(root)")
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    name = path.rpartition(".")[2] or "(root)"
    title = name if repeats == 1 else f"{name} … ×{repeats}"
    lines = [
        type(module).__name__,
        ROLES[role][1],
        f"parameters {human_bytes(params)}" if params else "",
    ]
    attrs = {"fillcolor": COLORS[ROLES[role][0]]}
    if role == "inside":
        attrs["style"] = "rounded,filled,dashed"
    if path in failed:
        attrs.update(color=COLORS["failure"], penwidth="2.5" if path == failed[-1] else "1.5")
    dot.node(node_id, html_label(title, lines), id=node_id, **attrs)
    fields = [
        ("path", path or "(root)"),
        ("class", type(module).__name__),
        ("role", ROLES[role][1]),
        ("parameters", human_bytes(params)),
    ]
    if repeats > 1:
        fields.append(("stands for", f"{repeats} identical siblings"))
    nodes[node_id] = NodeInfo(path or "(root)", tuple(fields), _nearest(subgraph_of, path))
    if parent_id:
        dot.edge(parent_id, node_id)
    for child_path, count in _children(model, plan, path, collapse, failed):
        _draw_subtree(
            dot, model, plan, child_path, node_id, count, collapse, failed, subgraph_of, nodes
        )


def _children(
    model: torch.nn.Module, plan: LeafPlan, path: str, collapse: bool, failed: Sequence[str]
) -> list[tuple[str, int]]:
    """Child paths in module order, each with the number of identical siblings it stands for."""
    module = model.get_submodule(path)
    paths = [f"{path}.{name}" if path else name for name, _ in module.named_children()]
    if not collapse:
        return [(p, 1) for p in paths]
    runs: list[tuple[str, int]] = []
    previous: tuple[str, ...] | None = None
    for child in paths:
        signature = subtree_signature(model, plan, child, failed)
        if runs and signature == previous:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((child, 1))
        previous = signature
    return runs


def _subgraph_of_modules(trace: RenderTrace) -> dict[str, int]:
    """Module path -> subgraph calling it, for the leaves of a traced model."""
    if trace.partitioned is None:
        return {}
    return {path: s.index for s in trace.partitioned.subgraphs for path in s.module_paths()}


def _nearest(subgraph_of: dict[str, int], path: str) -> int | None:
    """The subgraph of the closest called module at or above ``path``."""
    while True:
        if path in subgraph_of:
            return subgraph_of[path]
        if not path:
            return None
        path = path.rpartition(".")[0]
