"""Text for the project's self-contained HTML and SVG files: escaping, ids, JSON islands.

Both the trace viewer (:mod:`llmc_trace.render`) and the compression report
(:mod:`llmc_trace.report`) write pages that must be byte-identical from run to run and load
nothing. The report is written by every ``compress``, which must not import the viewer and
Graphviz, so what the two share lives here, below both.
"""

from __future__ import annotations

import html
import json
import re

#: No network of any kind; only the inline script and style may run.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
)
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")  # ":" would read as a DOT port


def page_start(title: str, css: str) -> str:
    """A self-contained page up to its header's heading: the policy above, the stylesheet
    inline, ``title`` (escaped here) as the tab's title and the ``<h1>``."""
    title = html.escape(title)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_SECURITY_POLICY}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
{css}</style>
</head>
<body>
<header>
<h1>{title}</h1>
"""


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def safe_id(prefix: str, name: str) -> str:
    """A DOT node name and SVG ``id`` made of safe characters.

    Node names and module paths use only safe characters already, so ids stay distinct.
    """
    return f"{prefix}{_UNSAFE_ID.sub(lambda m: f'_{ord(m.group()):x}_', name)}"


def html_text(text: str) -> str:
    """Escape text for XML: an SVG, or a graphviz HTML-like label."""
    return html.escape(text, quote=True)


def json_island(document: dict[str, object]) -> str:
    """JSON that cannot close its ``<script>`` element (``<``, ``>`` and ``&`` are escaped)."""
    text = json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
