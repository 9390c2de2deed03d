"""Lay a :class:`~llmc_trace.render.drawing.Drawing` out with Graphviz's ``dot`` into SVG.

``dot`` is deterministic: the same DOT source gives the same SVG bytes with the same Graphviz
version, which is what makes rendered files comparable from run to run.
"""

from __future__ import annotations

import re

import graphviz

from llmc_trace.render.drawing import Drawing
from llmc_trace.errors import DotNotFoundError, LayoutError

_PROLOGUE = re.compile(r"\A.*?(?=<svg\b)", re.DOTALL)


def render_svg(drawing: Drawing) -> str:
    """The drawing as a standalone SVG document.

    Raises :class:`~llmc_trace.errors.DotNotFoundError` (with install instructions)
    when Graphviz is missing.
    """
    try:
        svg = graphviz.pipe("dot", "svg", drawing.dot.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound as err:
        raise DotNotFoundError() from err
    except graphviz.CalledProcessError as err:
        stderr = (err.stderr or b"").decode("utf-8", "replace").strip()
        raise LayoutError(
            f"Graphviz's dot could not lay out the {drawing.view} view: {stderr or err}.",
            hint="Report this with the command line that produced it; `--view` and "
            "`--subgraphs` may avoid the offending part meanwhile.",
        ) from err
    return svg.decode("utf-8")


def inline_svg(svg: str) -> str:
    """The ``<svg>`` element alone, without the XML prologue, for embedding in HTML."""
    return _PROLOGUE.sub("", svg, count=1)
