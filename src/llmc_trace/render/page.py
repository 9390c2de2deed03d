"""One self-contained HTML page per picture: pan, zoom, search, a side panel, and unfolding.

The page loads nothing: the viewer's script and style are package files inlined here, the
pictures and node facts are a JSON island, and a Content-Security-Policy forbids every fetch,
so the file works offline, from an e-mail attachment, in a CI artifact store, or inside a
notebook cell (:func:`iframe`). Every view uses the same viewer; the failure, detail and
modules views are a page with one picture and nothing to unfold.
"""

from __future__ import annotations

import html
from importlib import resources
from collections.abc import Sequence
from typing import Any

from llmc_trace.core.markup import json_island, page_start
from llmc_trace.render.drawing import Drawing
from llmc_trace.render.overlay import Overlay
from llmc_trace.render.svg import lay_out
from llmc_trace.render.unfold import ROOT, PageContent
from llmc_trace.tracing.decisions import Decision


def asset(name: str) -> str:
    """A viewer file shipped as package data (``viewer.js``, ``viewer.css``)."""
    return resources.files("llmc_trace.render").joinpath(name).read_text(encoding="utf-8")


def render_html(drawing: Drawing) -> str:
    """The page of one view's picture (nothing to unfold)."""
    (fragment,) = lay_out([drawing.dot], f"{drawing.view} view")
    document = {
        **_empty_page(drawing.title),
        "fragments": {ROOT: fragment.to_json()},
        "nodes": {key: info.to_json() for key, info in drawing.nodes.items()},
        "subgraphs": {str(i): info.to_json() for i, info in drawing.subgraphs.items()},
    }
    return page_document(drawing.title, document, HINT)


def render_unfolding_html(
    content: PageContent,
    overlay: Overlay | None = None,
    decisions: Sequence[Decision] = (),
) -> str:
    """The page that opens on the overview and unfolds in place (see :mod:`.unfold`);
    ``decisions`` (those the trace recorded) are listed in the panel by its Decisions button."""
    document = {
        **_empty_page(content.title),
        "fragments": {key: f.to_json() for key, f in content.fragments.items()},
        "unfolds": {key: u.to_json() for key, u in content.unfolds.items()},
        "templates": content.templates,
        "nodes": {key: info.to_json() for key, info in content.nodes.items()},
        "parents": content.parents,
        "subgraphs": {str(i): info.to_json() for i, info in content.subgraphs.items()},
        "initial": content.initial,
        "overlay": None if overlay is None else overlay.to_json(content.stands_for),
        "decisions": [decision.to_json() for decision in decisions],
    }
    return page_document(content.title, document, UNFOLDING_HINT + " " + HINT)


def _empty_page(title: str) -> dict[str, Any]:
    return {
        "title": title,
        "root": ROOT,
        "unfolds": {},
        "templates": {},
        "parents": {},
        "initial": [],
        "overlay": None,
        "decisions": [],
    }


#: What the side panel says before a node is chosen.
HINT = (
    "Click a node to see its details and its subgraph's inputs and consumed names. "
    "Drag to pan, scroll to zoom."
)
UNFOLDING_HINT = (
    "Click a box marked + to unfold it in place, and its title bar to fold it again; search "
    "unfolds what hides a match (Enter). A link ending in #unfold=sg-5 opens it unfolded."
)


def page_document(title: str, document: dict[str, Any], hint: str = HINT) -> str:
    """The HTML around the viewer and its JSON ``document``; ``hint`` starts the panel."""
    return (
        page_start(title, asset("viewer.css"))
        + f"""<div class="toolbar">
<input id="search" type="search" placeholder="Search by node name, module path or op  ( / )" aria-label="Search nodes">
<button id="prev" title="Previous match (Shift+Enter)">&#9664;</button>
<button id="next" title="Next match (Enter), unfolding what hides it">&#9654;</button>
<span id="search-count"></span>
<button id="fit" title="Show the whole graph">Fit</button>
<button id="fold-all" title="Fold every unfolded box">Fold all</button>
<button id="decisions" title="The branches of model code the trace took, sample-dependent first">Decisions</button>
<span id="legend"></span>
</div>
</header>
<main>
<div id="canvas"></div>
<aside id="panel"><p class="hint">{html.escape(hint)}</p></aside>
</main>
<script type="application/json" id="llmc-data">{json_island(document)}</script>
<script>
{asset("viewer.js")}</script>
</body>
</html>
"""
    )


def iframe(page: str, height_px: int = 640) -> str:
    """``page`` inside an ``<iframe srcdoc>``: a notebook cell or another page shows it with
    its script and ids kept apart from the host's."""
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; '
        f'height: {height_px}px; border: 1px solid #e0e0e0" '
        'sandbox="allow-scripts" title="llmc-trace graph"></iframe>'
    )
