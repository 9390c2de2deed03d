"""The compression report: what ``compress`` did to each layer, as JSON and as a page.

``compress`` writes ``report.json`` (:mod:`llmc_trace.report.schema`, versioned) and
``report.html`` (:mod:`llmc_trace.report.page`) into its output folder, and its result carries
the same :class:`CompressionReport` when it compresses in memory.
``llmc-trace render --report report.json --out report.html`` redraws the page.

Names are imported when first used (PEP 562): a run that only builds the report (in memory,
or before it writes) imports the schema, not the page and its drawing. Neither needs the
trace viewer (:mod:`llmc_trace.render`) or Graphviz.
"""

from __future__ import annotations

from llmc_trace.core.lazy import lazy_attributes

_WHERE = {
    "SCHEMA": "llmc_trace.report.schema",
    "VERSION": "llmc_trace.report.schema",
    "CompressionReport": "llmc_trace.report.schema",
    "LayerRow": "llmc_trace.report.schema",
    "ReportSettings": "llmc_trace.report.schema",
    "StageSettings": "llmc_trace.report.schema",
    "SubgraphRow": "llmc_trace.report.schema",
    "parse_report": "llmc_trace.report.schema",
    "read_report": "llmc_trace.report.schema",
    "draw_report": "llmc_trace.report.drawing",
    "render_report_svg": "llmc_trace.report.drawing",
    "render_report_html": "llmc_trace.report.page",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes("llmc_trace.report", _WHERE)
