"""The compression report: what ``compress`` did to each layer, as JSON and as a page.

``compress`` writes ``report.json`` (:mod:`llmc_trace.report.schema`, versioned) and
``report.html`` (:mod:`llmc_trace.report.page`) into its output folder, and its result carries
the same :class:`CompressionReport` when it compresses in memory.
``llmc-trace render --report report.json --out report.html`` redraws the page.
"""

from llmc_trace.report.drawing import draw_report, render_report_svg
from llmc_trace.report.page import render_report_html
from llmc_trace.report.schema import (
    SCHEMA,
    VERSION,
    CompressionReport,
    LayerRow,
    ReportSettings,
    StageSettings,
    SubgraphRow,
    parse_report,
    read_report,
)

__all__ = [
    "SCHEMA",
    "VERSION",
    "CompressionReport",
    "LayerRow",
    "ReportSettings",
    "StageSettings",
    "SubgraphRow",
    "draw_report",
    "parse_report",
    "read_report",
    "render_report_html",
    "render_report_svg",
]
