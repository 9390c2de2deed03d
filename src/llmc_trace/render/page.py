"""Wrap an SVG drawing in one self-contained HTML page with pan, zoom, search and a side panel.

The page loads nothing: the viewer's script and style are package files inlined here, the
node facts are a JSON island, and a Content-Security-Policy forbids every fetch, so the file
works offline, from an e-mail attachment, or in a CI artifact store.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from llmc_trace.render.drawing import Drawing
from llmc_trace.render.svg import inline_svg

#: No network of any kind; only the inline script and style may run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
)


def asset(name: str) -> str:
    """A viewer file shipped as package data (``viewer.js``, ``viewer.css``)."""
    return resources.files("llmc_trace.render").joinpath(name).read_text(encoding="utf-8")


def json_island(document: dict[str, object]) -> str:
    """JSON that cannot close its ``<script>`` element (``<``, ``>`` and ``&`` are escaped)."""
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(drawing: Drawing, svg: str) -> str:
    """The page for ``drawing``, whose laid-out SVG is ``svg`` (from ``render_svg``)."""
    title = html.escape(drawing.title)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{asset("viewer.css")}</style>
</head>
<body>
<header>
<h1>{title}</h1>
<div class="toolbar">
<input id="search" type="search" placeholder="Search by node name, module path or op  ( / )" aria-label="Search nodes">
<button id="prev" title="Previous match (Shift+Enter)">&#9664;</button>
<button id="next" title="Next match (Enter)">&#9654;</button>
<span id="search-count"></span>
<button id="fit" title="Show the whole graph">Fit</button>
</div>
</header>
<main>
<div id="canvas">
{inline_svg(svg)}</div>
<aside id="panel"><p class="hint">Click a node to see its details and its subgraph's inputs and consumed names. Drag to pan, scroll to zoom.</p></aside>
</main>
<script type="application/json" id="llmc-data">{json_island(drawing.to_json())}</script>
<script>
{asset("viewer.js")}</script>
</body>
</html>
"""
