"""The unfolding page's contents: the overview, and every part it unfolds into, laid out once.

The page opens on the overview (runs of identical layers folded on a deep model) and unfolds
in place: a folded run into its layers, a layer into its subgraphs, a subgraph into its
operations, a module call into the module's children, a folded run of sibling modules into
its members. Every part is a small Graphviz picture laid out here, all in one ``dot`` run. The
page's script swaps a box for its picture and opens a gap below and to the right of the box,
so everything above and to the left stays where it was and nothing is laid out again in the
browser: unfolding stays immediate on an 80-layer model.

Module pictures are templates: identical modules (80 decoder layers, 256 experts) share one
picture in relative names, and the page names the boxes when it places them. A subgraph's
picture cannot be shared (node names carry counters), so each subgraph has its own; they are
small, since a subgraph holds about one layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmc_trace.core.sizes import parameter_bytes_by_path
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.render.detail import Operations
from llmc_trace.render.drawing import NodeInfo, SubgraphInfo, new_digraph
from llmc_trace.render.fold import Layer, ModuleRun, sibling_runs
from llmc_trace.render.labels import node_operation
from llmc_trace.render.modules import module_box, module_fields, run_title
from llmc_trace.render.nodes import fx_node_id
from llmc_trace.render.overview import (
    Box,
    box_title,
    draw_chain,
    Values,
    draw_overview,
    overview_boxes,
)
from llmc_trace.render.roles import module_role, subtree_signature
from llmc_trace.render.svg import Fragment, lay_out
from llmc_trace.traced.model import TracedModel

ROOT = "overview"


@dataclass(frozen=True)
class Unfolding:
    """What a box unfolds into: the picture ``fragment`` under the header ``title``.

    For a module template, ``path`` is the module path its relative names hang from.
    """

    fragment: str
    title: str
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"fragment": self.fragment, "title": self.title, "path": self.path}


@dataclass(frozen=True)
class PageContent:
    """Every picture of one page and what connects them.

    ``parents`` maps a node to the box whose unfolding shows it (absent: on the first
    picture), which is how search reveals a node inside folded parts. ``templates`` lists,
    for each module template, its boxes slot by slot: relative name, panel facts, and what
    the box unfolds into. ``stands_for`` gives the module paths each node stands for (what
    an overlay colours it by).
    """

    title: str
    fragments: dict[str, Fragment]
    unfolds: dict[str, Unfolding]
    templates: dict[str, list[dict[str, Any]]]
    nodes: dict[str, NodeInfo]
    parents: dict[str, str]
    subgraphs: dict[int, SubgraphInfo]
    stands_for: dict[str, list[str]]
    initial: list[str]


def unfolding_page(trace: TracedModel, expand: bool = False) -> PageContent:
    """The page of a traced model; ``expand`` opens it with every folded run unfolded."""
    assert trace.partitioned is not None, "the page needs a traced model"
    builder = _Builder(trace)
    overview = draw_overview(trace)
    builder.dots[ROOT] = overview.dot
    builder.nodes.update(overview.nodes)
    boxes = overview_boxes(trace)
    for box in boxes:
        builder.box(box, None)
    keys = list(builder.dots)
    fragments = dict(zip(keys, lay_out([builder.dots[k] for k in keys], "page")))
    return PageContent(
        title=overview.title,
        fragments=fragments,
        unfolds=builder.unfolds,
        templates=builder.templates,
        nodes=builder.nodes,
        parents=builder.parents,
        subgraphs=overview.subgraphs,
        stands_for=builder.stands_for,
        initial=[box.id for box in boxes if box.folded] if expand else [],
    )


class _Builder:
    """Collects the pictures, recursively from the overview's boxes down to module children."""

    def __init__(self, trace: TracedModel) -> None:
        self.trace = trace
        self.dots: dict[str, str] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.unfolds: dict[str, Unfolding] = {}
        self.templates: dict[str, list[dict[str, Any]]] = {}
        self.parents: dict[str, str] = {}
        self.stands_for: dict[str, list[str]] = {}
        self.operations = Operations(trace, set(), self.nodes)
        self.values = Values.of(trace)
        self.parameters = parameter_bytes_by_path(trace.model)
        self._template_keys: dict[tuple[object, ...], str] = {}

    def box(self, box: Box, parent: str | None) -> None:
        """Register ``box`` (shown by unfolding ``parent``) and everything it unfolds into."""
        if parent is not None:
            self.parents[box.id] = parent
        self.stands_for[box.id] = [t for s in box.subgraphs for t in s.targets]
        if box.folded:
            members = [Box((layer,)) for layer in box.layers]
        elif len(box.subgraphs) > 1:
            members = [Box((Layer(box.layers[0].path, (s,)),)) for s in box.subgraphs]
        else:
            key = f"sg:{box.subgraphs[0].index}"
            self.dots[key] = self._operations(box.subgraphs[0], box.id)
            self.unfolds[box.id] = Unfolding(key, box_title(box))
            return
        key = f"chain:{box.id}"
        self.dots[key] = draw_chain(self.trace, members, self.values, self.nodes)
        self.unfolds[box.id] = Unfolding(key, box_title(box))
        for member in members:
            self.box(member, box.id)

    def _operations(self, subgraph: Subgraph, box_id: str) -> str:
        """DOT of one subgraph's operations, every input a reference inside the picture."""
        drawn: dict[str, NodeInfo] = {}
        self.operations.nodes = drawn
        dot = new_digraph(f"sg{subgraph.index}", "")
        part = self.operations.draw(dot, subgraph)
        self.operations.draw_edges(dot, part)
        self.nodes.update(drawn)
        self.parents.update(dict.fromkeys(drawn, box_id))
        for node in part:
            if node.op != "call_module":
                continue
            path = str(node.target)
            self.stands_for[fx_node_id(node)] = [path]
            if any(True for _ in self.trace.model.get_submodule(path).children()):
                self.unfolds[fx_node_id(node)] = Unfolding(
                    self._template(path), node_operation(node), path
                )
        return dot.source

    def _template(self, path: str) -> str:
        """The template of ``path``'s children (shared by every identical module)."""
        module = self.trace.model.get_submodule(path)
        signature = (subtree_signature(module, self.trace.leaves, path), self._sizes(path))
        if signature in self._template_keys:
            return self._template_keys[signature]
        key = self._template_keys[signature] = f"t{len(self._template_keys)}"
        boxes: list[tuple[ModuleRun, dict[str, Any]]] = []
        for run in sibling_runs(module, path, self.trace.leaves):
            if len(run) > 1:
                run_key = self._run_template(path, run)
                boxes.append((run, {"unfold": run_key, "prefix": "parent"}))
            else:
                boxes.append((run, self._unfold_of(run[0][0])))
        self._draw_template(key, path, boxes)
        return key

    def _run_template(self, parent: str, run: ModuleRun) -> str:
        """The template listing the members of a folded run of sibling modules."""
        first_path, first = run[0]
        member = (subtree_signature(first, self.trace.leaves, first_path), self._sizes(first_path))
        names = tuple(p[len(parent) + 1 :] for p, _ in run)
        signature = ("run", names, member)
        if signature in self._template_keys:
            return self._template_keys[signature]
        key = self._template_keys[signature] = f"t{len(self._template_keys)}"
        self._draw_template(key, parent, [([m], self._unfold_of(m[0])) for m in run])
        return key

    def _unfold_of(self, path: str) -> dict[str, Any]:
        module = self.trace.model.get_submodule(path)
        has_children = any(True for _ in module.children())
        return {"unfold": self._template(path), "prefix": "self"} if has_children else {}

    def _draw_template(
        self, key: str, parent: str, boxes: list[tuple[ModuleRun, dict[str, Any]]]
    ) -> None:
        """A column of module boxes named relative to ``parent``."""
        dot = new_digraph(key, "")
        dot.attr("graph", ranksep="0.12")
        records = []
        for slot, (run, unfold) in enumerate(boxes):
            path, module = run[0]
            members = [p for p, _ in run]
            role = module_role(self.trace.leaves, path)
            params = self.parameters.get(path, 0)
            node_id = f"c{slot}"
            dot.node(node_id, id=node_id, **module_box(module, role, params, run_title(members)))
            if slot:
                dot.edge(f"c{slot - 1}", node_id, style="invis")
            first = path[len(parent) + 1 :]
            last = members[-1][len(parent) + 1 :]
            fields = module_fields(module, path, role, params, members)[1:]  # the path varies
            records.append(
                {"name": first if len(run) == 1 else f"{first}-{last}", "fields": fields, **unfold}
            )
        self.dots[key] = dot.source
        self.templates[key] = records

    def _sizes(self, path: str) -> tuple[int, ...]:
        module = self.trace.model.get_submodule(path)
        prefix = f"{path}." if path else ""
        return tuple(
            self.parameters.get(f"{prefix}{name}" if name else path, 0)
            for name, _ in module.named_modules()
        )
