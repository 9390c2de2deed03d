"""Lay drawings out with Graphviz's ``dot``: one SVG document, or many fragments in one run.

``dot`` is deterministic: the same DOT source gives the same SVG bytes with the same Graphviz
version, which is what makes rendered files comparable from run to run. The HTML page needs
one small picture per part it can unfold (a subgraph's operations, a module's children), up
to hundreds for a deep model; :func:`lay_out` lays them all out in a single ``dot`` process,
since starting one per picture would cost more than the layouts themselves.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import graphviz

from llmc_trace.errors import DotNotFoundError, LayoutError
from llmc_trace.render.drawing import FONT, Drawing

_PROLOGUE = re.compile(r"\A.*?(?=<svg\b)", re.DOTALL)
_DOCUMENT = re.compile(
    r'<svg width="[^"]*" height="[^"]*"\s+viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)".*?>\s*'
    r'<g id="[^"]*" class="graph" transform="scale\(1 1\) rotate\(0\) translate\(([-\d.]+) '
    r'([-\d.]+)\)">\s*<title>[^<]*</title>\s*<polygon fill="white"[^>]*/>\s*(.*?)</g>\s*</svg>',
    re.DOTALL,
)
#: What a fragment does not need: comments, tooltips naming DOT ids, the ids Graphviz
#: numbers per graph (they would repeat when several fragments share a page), and the font
#: every text names (the page's style sets it once).
_NOISE = re.compile(
    r'<!--.*?-->\n?|<title>[^<]*</title>\n?| id="(?:node|edge|clust)\d+"'
    rf'| font-family="{re.escape(FONT)}"',
    re.DOTALL,
)


def run_dot(source: str, what: str) -> str:
    """SVG for the DOT ``source`` (one graph or several); ``what`` names it in errors.

    Raises :class:`~llmc_trace.errors.DotNotFoundError` (with install instructions)
    when Graphviz is missing.
    """
    try:
        svg = graphviz.pipe("dot", "svg", source.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound as err:
        raise DotNotFoundError() from err
    except graphviz.CalledProcessError as err:
        stderr = (err.stderr or b"").decode("utf-8", "replace").strip()
        raise LayoutError(
            f"Graphviz's dot could not lay out the {what}: {stderr or err}.",
            hint="Report this with the command line that produced it; `--view` and "
            "`--subgraphs` may avoid the offending part meanwhile.",
        ) from err
    return svg.decode("utf-8")


def render_svg(drawing: Drawing) -> str:
    """The drawing as a standalone SVG document."""
    return run_dot(drawing.dot, f"{drawing.view} view")


def inline_svg(svg: str) -> str:
    """The ``<svg>`` element alone, without the XML prologue, for embedding in HTML."""
    return _PROLOGUE.sub("", svg, count=1)


@dataclass(frozen=True)
class Fragment:
    """One laid-out graph for a page: its size in points and its SVG elements.

    ``svg`` is in Graphviz's coordinates (y grows downwards from the bottom edge at 0, so it
    is negative); translating by ``offset`` puts the picture in ``[0, width] x [0, height]``.
    """

    width: float
    height: float
    offset: tuple[float, float]
    svg: str

    def to_json(self) -> dict[str, object]:
        return {"w": self.width, "h": self.height, "o": list(self.offset), "svg": self.svg}


def lay_out(sources: Sequence[str], what: str = "page") -> list[Fragment]:
    """Each DOT source laid out as a :class:`Fragment`, in order, by one ``dot`` process."""
    if not sources:
        return []
    documents = _DOCUMENT.findall(run_dot("\n".join(sources), what))
    assert len(documents) == len(sources), "dot wrote one SVG document per graph"
    return [
        Fragment(float(width), float(height), (float(x), float(y)), _NOISE.sub("", body))
        for width, height, x, y, body in documents
    ]
