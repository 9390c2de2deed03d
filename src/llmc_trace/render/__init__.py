"""See the graph: draw a model's trace as SVG or as one self-contained interactive HTML page.

Four views, each answering one question:

* ``overview``: which subgraphs run in order, and which values the intermediates cache keeps
  between them (and for how long);
* ``detail``: what operations a subgraph holds, clustered by module;
* ``modules``: which modules tracing walks into and which it records as one call, the
  picture behind choosing sequential targets and modules to ignore;
* ``failure``: where tracing stopped, and where the offending value came from.

>>> from llmc_trace.render import render
>>> render("meta-llama/Llama-2-7b-hf", "llama.html", view="overview")  # doctest: +SKIP
"""

from llmc_trace.core.names import VIEWS
from llmc_trace.render.api import RenderResult, draw, render, render_trace
from llmc_trace.render.drawing import Drawing
from llmc_trace.errors import DotNotFoundError, NotTraceableError
from llmc_trace.render.page import render_html
from llmc_trace.render.svg import render_svg

__all__ = [
    "VIEWS",
    "DotNotFoundError",
    "Drawing",
    "NotTraceableError",
    "RenderResult",
    "draw",
    "render",
    "render_html",
    "render_svg",
    "render_trace",
]
