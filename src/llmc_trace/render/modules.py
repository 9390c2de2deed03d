"""The modules view: the module tree coloured by what tracing does with each module.

This is the picture behind choosing sequential targets and modules to ignore. Tracing walks
*into* the ancestors of the sequential targets (blue) and records every other module it meets
as one opaque call: the targets themselves (green), ignored modules (orange), and modules
that hold no target (purple). Nothing inside those is traced (grey), so untraceable code there
does no harm; untraceable code in a blue module is what ``--ignore`` or a different target
choice must move into a leaf. Where tracing failed, the modules on the failure's stack are
outlined in red.

The tree is drawn top to bottom in module order, each module with children as a box holding
them, so the picture grows in height with the number of modules and in width only with the
nesting depth. On a deep model (a run of more than :data:`~llmc_trace.render.fold.FOLD_ABOVE`
identical numbered siblings) consecutive numbered siblings with identical subtrees
(``layers.0`` to ``layers.79``, ``experts.0`` to ``experts.127``) are drawn once, labelled with
how many they stand for, unless ``expand`` is set. A tree of more than :data:`MAX_MODULES`
modules is folded anyway: Graphviz needs minutes for such a tree, and nobody can read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import graphviz
import torch

from llmc_trace.core.sizes import human_bytes, parameter_bytes_by_path
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
from llmc_trace.render.fold import ModuleRun, is_deep, longest_sibling_run, sibling_runs
from llmc_trace.core.markup import safe_id
from llmc_trace.render.roles import ROLES, module_role
from llmc_trace.traced.model import TracedModel

#: Above this many modules the tree is drawn folded (dot takes ~1 s per 200 nodes here).
MAX_MODULES = 3000


def draw_modules(trace: TracedModel, expand: bool = False) -> Drawing:
    """The modules view of a model, traced or not; see the module docstring."""
    plan = trace.leaves
    count = sum(1 for _ in trace.model.modules())
    failed = [path for path, _ in trace.failure.module_stack] if trace.failure else []
    deep = is_deep([longest_sibling_run(trace.model, "", plan, failed)])
    fold = (deep and not expand) or count > MAX_MODULES
    caption = [
        (
            f"{trace.name} · modules · {len(plan.targets)} sequential targets, "
            f"{len(plan.ignored)} ignored"
        ),
        "Tracing walks into blue modules only; each other coloured module is one call in the graph.",
    ]
    if count > MAX_MODULES:
        caption.append(
            f"{count} modules are too many to draw: identical numbered ones are drawn once."
        )
    elif fold:
        caption.append(
            "Identical numbered modules are drawn once (×N: how many); expand draws each."
        )
    if failed:
        caption.append(
            f"Red outline: the modules tracing was inside when it failed ({failed[-1]})."
        )
    legend = [(COLORS[color], text) for color, text in ROLES.values()]
    dot = new_digraph("modules", caption_label(caption, legend))
    dot.attr("graph", ranksep="0.12")
    tree = _ModuleTree(trace, fold, failed)
    tree.draw(dot, trace.model, "", [""])
    for above, below in zip(tree.order, tree.order[1:]):
        dot.edge(above, below, style="invis")  # one module per row, in module order
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


def module_box(
    module: torch.nn.Module, role: str, parameter_bytes: int, title: str
) -> dict[str, str]:
    """The label and colours of one module's box, shared by this view and the page."""
    size = f"parameters {human_bytes(parameter_bytes)}" if parameter_bytes else ""
    attrs = {
        "label": html_label(title, [type(module).__name__, ROLES[role][1], size]),
        "fillcolor": COLORS[ROLES[role][0]],
    }
    if role == "inside":
        attrs["style"] = "rounded,filled,dashed"
    return attrs


def module_fields(
    module: torch.nn.Module, path: str, role: str, parameter_bytes: int, members: Sequence[str]
) -> list[tuple[str, str]]:
    """The side-panel facts of a module (standing for its identical ``members``)."""
    fields = [
        ("path", path or "(root)"),
        ("class", type(module).__name__),
        ("role", ROLES[role][1]),
        ("parameters", human_bytes(parameter_bytes)),
    ]
    if len(members) > 1:
        first, last = (m.rpartition(".")[2] for m in (members[0], members[-1]))
        fields.append(("stands for", f"{len(members)} identical modules, {first} to {last}"))
    return fields


def run_title(members: Sequence[str]) -> str:
    """``layers.0`` alone, or ``0–79 ×80`` for a folded run of siblings."""
    name = members[0].rpartition(".")[2] or "(root)"
    if len(members) == 1:
        return name
    return f"{name}–{members[-1].rpartition('.')[2]} ×{len(members)}"


class _ModuleTree:
    """Draws one module per row, depth first in module order (state shared by the recursion).

    A module with children is a box (a cluster) holding its own row and its children's.
    """

    def __init__(self, trace: TracedModel, fold: bool, failed: Sequence[str]) -> None:
        self.plan, self.fold, self.failed = trace.leaves, fold, failed
        self.parameters = parameter_bytes_by_path(trace.model)
        self.subgraph_of = (
            {}
            if trace.partitioned is None
            else {p: s.index for s in trace.partitioned.subgraphs for p in s.module_paths()}
        )
        self.nodes: dict[str, NodeInfo] = {}
        self.order: list[str] = []

    def draw(
        self, into: graphviz.Digraph, module: torch.nn.Module, path: str, members: Sequence[str]
    ) -> None:
        """Draw ``module`` (standing for its identical ``members``) and everything below it."""
        role = module_role(self.plan, path)
        node_id = safe_id("m-", path or "(root)")
        params = self.parameters.get(path, 0)
        attrs = module_box(module, role, params, run_title(members))
        if path in self.failed:
            attrs.update(
                color=COLORS["failure"], penwidth="2.5" if path == self.failed[-1] else "1.5"
            )
        fields = module_fields(module, path, role, params, members)
        self.nodes[node_id] = NodeInfo(path or "(root)", tuple(fields), self._subgraph(path))
        self.order.append(node_id)
        runs = self._children(module, path)
        if not runs:
            into.node(node_id, id=node_id, **attrs)
            return
        with cluster(into, safe_id("cluster_", node_id)) as box:
            box.attr(label="", style="rounded", color="#9e9e9e", margin="6")
            box.node(node_id, id=node_id, **attrs)
            for run in runs:
                self.draw(box, run[0][1], run[0][0], [p for p, _ in run])

    def _children(self, module: torch.nn.Module, path: str) -> list[ModuleRun]:
        runs = sibling_runs(module, path, self.plan, self.failed)
        return runs if self.fold else [[member] for run in runs for member in run]

    def _subgraph(self, path: str) -> int | None:
        """The subgraph of the closest called module at or above ``path``."""
        while True:
            if path in self.subgraph_of:
                return self.subgraph_of[path]
            if not path:
                return None
            path = path.rpartition(".")[0]
