"""The compression report's page: its overview beside the layers, highest relative loss first.

The table gives each layer's numbers and the ``compress`` option that keeps it in full
precision; clicking a box of the overview lists its layers, and a column header sorts by it.
The page is one self-contained file (inline style and script, a Content-Security-Policy that
forbids every fetch), and the same report gives the same bytes. It needs neither Graphviz nor
the trace viewer (:mod:`llmc_trace.report.drawing` lays the overview out itself), so writing
it costs ``compress`` no import of either.
"""

from __future__ import annotations

import html
import shlex
from importlib import resources

from llmc_trace.core.markup import json_island, page_start, plural
from llmc_trace.core.sizes import human_bytes
from llmc_trace.report.drawing import (
    box_id,
    describe_stage,
    draw_report,
    loss_colour,
    number_text,
    ratio_text,
    row_id,
)
from llmc_trace.report.schema import CompressionReport


def render_report_html(report: CompressionReport) -> str:
    """The report page; see the module docstring."""
    overview = draw_report(report)
    picture, boxes = overview.svg, overview.boxes
    start = page_start(f"{report.model} · compression report", _asset("report.css"))
    return (
        start
        + f"""{_summary_html(report)}
</header>
<main>
<section id="overview">
{picture}</section>
<section id="layers">
{_keep_html(report)}
<p id="filter" hidden><span id="filter-text"></span> <button id="show-all">Show all layers</button></p>
{_table_html(report)}
</section>
</main>
<script type="application/json" id="report-boxes">{json_island(boxes)}</script>
<script>
{_asset("report.js")}</script>
</body>
</html>
"""
    )


def _summary_html(report: CompressionReport) -> str:
    settings = report.settings
    lines = [
        f"{settings.calibrated_on()} from "
        f"{settings.dataset} · {settings.dtype} checkpoint · solved on {report.device}"
    ]
    for summary, stage in zip(report.summary(), settings.stages):
        line = f"{describe_stage(stage)} ({stage.pipeline}): {plural(summary['layers'], 'layer')}"
        if summary["relative_loss"] is not None:
            line += (
                f", loss {summary['relative_loss']:.3f}× its baseline's in all, median layer "
                f"{summary['median_relative_loss']:.3f}×"
            )
        line += f", {summary['seconds']:.1f} s solving"
        lines.append(line)
    return "\n".join(f"<p>{html.escape(line)}</p>" for line in lines)


def _keep_html(report: CompressionReport) -> str:
    worst = [row for row in report.worst(len(report.layers)) if row.ignore][:5]
    if not worst:
        return "<h2>Layers</h2>"
    # a fused layer's rows each suggest its siblings: every layer once
    kept = dict.fromkeys(name for row in worst for name in shlex.split(row.ignore)[1::2])
    options = " ".join(f"--ignore {shlex.quote(name)}" for name in kept)
    command = f"llmc-trace compress -m MODEL -r OUT/recipe.yaml -o NEW_OUT {options}"
    return (
        "<h2>Layers, highest relative loss first</h2>\n"
        f"<p>To keep the {plural(len(worst), 'worst layer')} in full precision, compress again "
        "with the recipe written beside the checkpoint and these options:</p>\n"
        f'<pre id="keep-command">{html.escape(command)}</pre>'
    )


_COLUMNS = (
    ("layer", "text"),
    ("stage", "number"),
    ("method", "text"),
    ("relative loss", "number"),
    ("loss", "number"),
    ("baseline loss", "number"),
    ("tokens", "number"),
    ("seconds", "number"),
    ("device peak", "number"),
    ("shares H with", "text"),
    ("keep in full precision", "text"),
)


def _table_html(report: CompressionReport) -> str:
    """The rows, worst relative loss first, then the rows without one in layer order; each
    cell carries its sort key, which the page's script sorts by."""
    ranked = report.worst()
    rows = ranked + [row for row in report.layers if row.relative_loss is None]
    header = "".join(
        f'<th data-kind="{kind}" title="Sort by {name}">{html.escape(name)}</th>'
        for name, kind in _COLUMNS
    )
    body = []
    for row in rows:
        group = box_id(row)
        peak = human_bytes(row.device_peak_bytes) if row.device_peak_bytes is not None else "—"
        cells = (
            (row.name, row.name),
            (str(row.stage), row.stage),
            (row.fallback or row.method, row.method),
            (ratio_text(row.relative_loss), row.relative_loss),
            (number_text(row.loss), row.loss),
            (number_text(row.baseline_loss), row.baseline_loss),
            ("—" if row.num_tokens is None else str(row.num_tokens), row.num_tokens),
            (f"{row.seconds:.3f}", row.seconds),
            (peak, row.device_peak_bytes),
            (row.shares_hessian_with or "—", row.shares_hessian_with or ""),
            (row.ignore or "—", row.ignore or ""),
        )
        tds = "".join(
            f'<td data-value="{html.escape("" if key is None else str(key))}"'
            + (f' style="background:{loss_colour(row.relative_loss)}"' if i == 3 else "")
            + f">{html.escape(text)}</td>"
            for i, (text, key) in enumerate(cells)
        )
        body.append(f'<tr id="{row_id(row)}" data-group="{group}">{tds}</tr>')
    return (
        f'<table id="layer-table">\n<thead><tr>{header}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody>\n</table>"
    )


def _asset(name: str) -> str:
    """The page's script or style, shipped as package data beside this module."""
    return resources.files("llmc_trace.report").joinpath(name).read_text(encoding="utf-8")
