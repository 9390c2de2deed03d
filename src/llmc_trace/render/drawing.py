"""``Drawing``: what a view produces, a DOT graph plus the facts the HTML side panel shows.

Views never run graphviz and never write files; :mod:`~llmc_trace.render.svg` lays a drawing
out and :mod:`~llmc_trace.render.page` wraps it in HTML. Keeping the panel's facts beside the
DOT source (keyed by the SVG ``id`` of each node) lets the page stay a static file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import graphviz

from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.core.markup import html_text

FONT = "Helvetica,Arial,sans-serif"

#: Colours of module roles and highlights, shared by every view and the legend.
COLORS = {
    "target": "#c8e6c9",
    "ignored": "#ffe0b2",
    "ancestor": "#bbdefb",
    "leaf": "#e1bee7",
    "inside": "#f5f5f5",
    "input": "#fff9c4",
    "failure": "#ef5350",
    "origin": "#ffcdd2",
    "skip": "#d84315",
    "skip_swatch": "#ffccbc",
    "plain": "#ffffff",
}


@dataclass(frozen=True)
class NodeInfo:
    """The side panel of one drawn node: a title, its facts, and the subgraph it belongs to."""

    title: str
    fields: tuple[tuple[str, str], ...]
    subgraph: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "fields": [list(f) for f in self.fields],
            "subgraph": self.subgraph,
        }


@dataclass(frozen=True)
class SubgraphInfo:
    """A subgraph's interface: what it reads, what the cache may drop after it, what it writes."""

    index: int
    targets: tuple[str, ...]
    input_names: tuple[str, ...]
    consumed_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @classmethod
    def of(cls, subgraph: Subgraph) -> SubgraphInfo:
        return cls(
            subgraph.index,
            tuple(subgraph.targets),
            tuple(subgraph.input_names),
            tuple(subgraph.consumed_names),
            tuple(subgraph.output_names),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "targets": list(self.targets),
            "inputs": list(self.input_names),
            "consumed": list(self.consumed_names),
            "outputs": list(self.output_names),
        }


@dataclass(frozen=True)
class Drawing:
    """One view, ready for layout.

    ``nodes`` has an entry for every node of ``dot`` (same keys as the SVG ids), in drawing
    order, so the SVG's node count is ``len(nodes)``.
    """

    view: str
    title: str
    caption: str
    dot: str
    nodes: dict[str, NodeInfo]
    subgraphs: dict[int, SubgraphInfo]

    def to_json(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "title": self.title,
            "caption": self.caption,
            "nodes": {key: info.to_json() for key, info in self.nodes.items()},
            "subgraphs": {str(i): info.to_json() for i, info in self.subgraphs.items()},
        }


def new_digraph(name: str, caption: str, rankdir: str = "TB") -> graphviz.Digraph:
    """A digraph with the project's fonts and a caption on top."""
    return graphviz.Digraph(
        name,
        graph_attr={
            "rankdir": rankdir,
            "fontname": FONT,
            "fontsize": "12",
            "label": caption,
            "labelloc": "t",
            "labeljust": "l",
            "nodesep": "0.25",
            "ranksep": "0.35",
        },
        node_attr={
            "fontname": FONT,
            "fontsize": "10",
            "shape": "box",
            "style": "rounded,filled",
            "fillcolor": COLORS["plain"],
            "margin": "0.08,0.04",
        },
        edge_attr={"fontname": FONT, "fontsize": "9", "arrowsize": "0.6"},
    )


@contextmanager
def cluster(into: graphviz.Digraph, name: str) -> Iterator[graphviz.Digraph]:
    """A subgraph of ``into`` for a ``with`` block, added to it when the block ends.

    graphviz's own ``subgraph()`` context copies the parent's whole body first, which makes a
    picture with hundreds of clusters (a page's operations, an expanded module tree)
    quadratic to build; this one starts empty and produces the same DOT.
    """
    subgraph = graphviz.Digraph(name=name)
    yield subgraph
    into.subgraph(subgraph)


def html_label(title: str, lines: Sequence[str] = (), title_size: int = 11) -> str:
    """A graphviz HTML-like label: a bold first line, then smaller plain lines."""
    parts = [f'<FONT POINT-SIZE="{title_size}"><B>{html_text(title)}</B></FONT>']
    parts += [f'<FONT POINT-SIZE="9">{html_text(line)}</FONT>' for line in lines if line]
    return "<" + "<BR/>".join(parts) + ">"


def table_label(lines: Sequence[str]) -> str:
    """A left-aligned block of small lines (edge labels); a table is how DOT aligns HTML text."""
    rows = "".join(f'<TR><TD ALIGN="LEFT">{html_text(line)}</TD></TR>' for line in lines)
    return f'<<TABLE BORDER="0" CELLSPACING="0" CELLPADDING="0">{rows}</TABLE>>'


def caption_label(lines: Sequence[str], legend: Sequence[tuple[str, str]] = ()) -> str:
    """The graph's caption: left-aligned lines, then a row of colour swatches explaining them.

    The legend is part of the label, not a set of nodes, so every SVG node is a graph element.
    """
    rows = [
        f'<TR><TD ALIGN="LEFT" COLSPAN="{max(len(legend), 1)}">{html_text(line)}</TD></TR>'
        for line in lines
    ]
    if legend:
        cells = "".join(
            f'<TD BGCOLOR="{color}" BORDER="1">{html_text(text)}</TD>' for color, text in legend
        )
        rows.append(f"<TR>{cells}</TR>")
    return f'<<TABLE BORDER="0" CELLSPACING="4" CELLPADDING="2">{"".join(rows)}</TABLE>>'
