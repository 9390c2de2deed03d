"""The modules view: the module tree coloured by what tracing does with each module.

This is the picture behind choosing sequential targets and modules to ignore. Tracing walks
*into* the ancestors of the sequential targets (blue) and records every other module it meets
as one opaque call: the targets themselves (green), ignored modules (orange), and modules
that hold no target (purple). Nothing inside those is traced (grey), so untraceable code there
does no harm; untraceable code in a blue module is what ``--ignore`` or a different target
choice must move into a leaf. Where tracing failed, the modules on the failure's stack are
outlined in red.

With ``collapse``, consecutive numbered siblings with identical subtrees (``layers.0`` to
``layers.79``, ``expert_0`` to ``expert_127``) are drawn once, labelled with how many they
stand for. A tree of more than :data:`MAX_MODULES` modules is collapsed anyway: Graphviz needs
minutes for such a tree, and nobody can read it.
"""

from __future__ import annotations

import re
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
from llmc_trace.core.sizes import human_bytes, parameter_bytes_by_path
from llmc_trace.render.labels import safe_id
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET, LEAF_TARGET, LeafPlan

#: Role -> (colour key, sentence shown in the legend and the side panel).
ROLES: dict[str, tuple[str, str]] = {
    "target": ("target", LEAF_TARGET),
    "ignored": ("ignored", LEAF_IGNORED),
    "ancestor": ("ancestor", "traced through (holds a sequential target)"),
    "leaf": ("leaf", f"leaf: {LEAF_NO_TARGET}"),
    "inside": ("inside", "inside a leaf, not traced"),
}
#: Above this many modules the tree is drawn collapsed (dot takes ~1 s per 200 nodes here).
MAX_MODULES = 3000
_NUMBERED = re.compile(r"^(.*?)\d+$")


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
    module: torch.nn.Module, plan: LeafPlan, path: str, marked: Collection[str] = ()
) -> tuple[str, ...]:
    """Classes, relative paths and roles below ``path``: equal for interchangeable layers.

    A module in ``marked`` (the failure's stack) never looks like its siblings, so
    collapsing cannot hide it.
    """
    signature = []
    for name, sub in module.named_modules():
        full = f"{path}.{name}" if name else path
        mark = "!" if full in marked else ""
        signature.append(f"{name}:{type(sub).__name__}:{module_role(plan, full)}{mark}")
    return tuple(signature)


def draw_modules(trace: TracedModel, collapse: bool = False) -> Drawing:
    """The modules view of a model, traced or not; see the module docstring."""
    plan = trace.leaves
    count = sum(1 for _ in trace.model.modules())
    caption = [
        (
            f"{trace.name} · modules · {len(plan.targets)} sequential targets, "
            f"{len(plan.ignored)} ignored"
        ),
        "Tracing walks into blue modules only; each other coloured module is one call in the graph.",
    ]
    if not collapse and count > MAX_MODULES:
        caption.append(
            f"{count} modules are too many to draw: identical numbered ones are collapsed."
        )
    failed = [path for path, _ in trace.failure.module_stack] if trace.failure else []
    if failed:
        caption.append(
            f"Red outline: the modules tracing was inside when it failed ({failed[-1]})."
        )
    legend = [(COLORS[color], text) for color, text in ROLES.values()]
    dot = new_digraph("modules", caption_label(caption, legend), rankdir="LR")
    dot.attr("graph", ranksep="0.5")
    tree = _ModuleTree(trace, dot, collapse or count > MAX_MODULES, failed)
    tree.draw(trace.model, "", "", [""])
    return Drawing(
        view="modules",
        title=f"{trace.name} · modules",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=tree.nodes,
        subgraphs={}
        if trace.partitioned is None
        else {s.index: SubgraphInfo.of(s) for s in trace.partitioned.subgraphs},
    )


class _ModuleTree:
    """Draws one module per node, depth first in module order (state shared by the recursion)."""

    def __init__(
        self, trace: TracedModel, dot: graphviz.Digraph, collapse: bool, failed: Sequence[str]
    ) -> None:
        self.plan, self.dot, self.collapse, self.failed = trace.leaves, dot, collapse, failed
        self.parameters = parameter_bytes_by_path(trace.model)
        self.subgraph_of = (
            {}
            if trace.partitioned is None
            else {p: s.index for s in trace.partitioned.subgraphs for p in s.module_paths()}
        )
        self.nodes: dict[str, NodeInfo] = {}

    def draw(
        self, module: torch.nn.Module, path: str, parent_id: str, siblings: Sequence[str]
    ) -> None:
        """Draw ``module`` (standing for its identical ``siblings``) and everything below it."""
        role = module_role(self.plan, path)
        node_id = safe_id("m-", path or "(root)")
        params = self.parameters.get(path, 0)
        name = path.rpartition(".")[2] or "(root)"
        last = siblings[-1].rpartition(".")[2]
        title = name if len(siblings) == 1 else f"{name}–{last} ×{len(siblings)}"
        cls = type(module).__name__
        size = f"parameters {human_bytes(params)}" if params else ""
        attrs = {"fillcolor": COLORS[ROLES[role][0]]}
        if role == "inside":
            attrs["style"] = "rounded,filled,dashed"
        if path in self.failed:
            attrs.update(
                color=COLORS["failure"], penwidth="2.5" if path == self.failed[-1] else "1.5"
            )
        self.dot.node(node_id, html_label(title, [cls, ROLES[role][1], size]), id=node_id, **attrs)
        fields = [
            ("path", path or "(root)"),
            ("class", cls),
            ("role", ROLES[role][1]),
            ("parameters", human_bytes(params)),
        ]
        if len(siblings) > 1:
            fields.append(("stands for", f"{len(siblings)} identical modules, {name} to {last}"))
        self.nodes[node_id] = NodeInfo(path or "(root)", tuple(fields), self._subgraph(path))
        if parent_id:
            self.dot.edge(parent_id, node_id)
        for run in self._children(module, path):
            self.draw(run[0][1], run[0][0], node_id, [p for p, _ in run])

    def _children(
        self, module: torch.nn.Module, path: str
    ) -> list[list[tuple[str, torch.nn.Module]]]:
        """Children in module order, grouped into runs of identical numbered siblings.

        Only numbered children (``layers.0``, ``expert_3``) with one prefix are merged: named
        ones such as ``q_proj`` and ``k_proj`` mean different things even when alike.
        """
        runs: list[list[tuple[str, torch.nn.Module]]] = []
        previous: tuple[str | None, tuple[str, ...]] | None = None
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            numbered = _NUMBERED.match(name)
            key = None
            if self.collapse and numbered is not None:
                key = (
                    numbered.group(1),
                    subtree_signature(child, self.plan, child_path, self.failed),
                )
            if key is not None and key == previous:
                runs[-1].append((child_path, child))
            else:
                runs.append([(child_path, child)])
            previous = key
        return runs

    def _subgraph(self, path: str) -> int | None:
        """The subgraph of the closest called module at or above ``path``."""
        while True:
            if path in self.subgraph_of:
                return self.subgraph_of[path]
            if not path:
                return None
            path = path.rpartition(".")[0]
