"""See the graph: draw a model's trace as SVG or as one self-contained interactive HTML page.

Four views, each answering one question (each as an SVG picture or a self-contained page):

* ``overview``: which subgraphs run in order, and which values the intermediates cache keeps
  between them (and for how long);
* ``detail``: what operations a subgraph holds, clustered by module;
* ``modules``: which modules tracing walks into and which it records as one call, the
  picture behind choosing sequential targets and modules to ignore;
* ``failure``: where tracing stopped, and where the offending value came from.

The overview's page unfolds in place, down to operations and module children
(:func:`render_page`), and an :class:`Overlay` colours it by a value per module.

>>> from llmc_trace.render import render
>>> render("meta-llama/Llama-3.1-70B", "llama.html", view="overview")  # doctest: +SKIP
"""

from llmc_trace.core.names import VIEWS
from llmc_trace.errors import DotNotFoundError, NotTraceableError
from llmc_trace.render.api import RenderResult, draw, render, render_page, render_trace
from llmc_trace.render.drawing import Drawing
from llmc_trace.render.overlay import Overlay
from llmc_trace.render.page import iframe, render_html
from llmc_trace.render.svg import render_svg

__all__ = [
    "VIEWS",
    "DotNotFoundError",
    "Drawing",
    "NotTraceableError",
    "Overlay",
    "RenderResult",
    "draw",
    "iframe",
    "render",
    "render_html",
    "render_page",
    "render_svg",
    "render_trace",
]
