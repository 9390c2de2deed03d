"""In a notebook, ``attempt_trace``'s report and a render's result show the page itself."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from llmc_trace import attempt_trace
from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.render import render_trace
from llmc_trace.traced.model import TracedModel
from tests.patterns import untraceable as patterns
from tests.render.helpers import failing_trace
from tests.render.test_output import assert_self_contained


def framed_page(markup: str) -> str:
    """The document an ``<iframe srcdoc>`` shows."""
    match = re.fullmatch(
        r'<iframe srcdoc="([^"]*)"[^>]*sandbox="allow-scripts"[^>]*></iframe>', markup
    )
    assert match, markup[:200]
    return html.unescape(match.group(1))


def page_data(page: str) -> dict:
    return json.loads(re.search(r'id="llmc-data">(.*?)</script>', page).group(1))  # type: ignore[union-attr]


def test_an_attempts_report_shows_the_same_page_render_writes(tmp_path: Path) -> None:
    report = attempt_trace("meta-llama/Llama-3.1-70B", verify=False)
    page = framed_page(report._repr_html_())  # type: ignore[arg-type]
    assert_self_contained(page)
    assert report.traced_model is not None
    written = render_trace(report.traced_model, tmp_path / "page.html").path.read_text()
    assert page == written
    data = page_data(page)
    assert {"sg-0", "sg-1-79", "sg-80"} <= set(data["nodes"])
    assert {f"sg:{s.index}" for s in report.traced_model.subgraphs} <= set(data["fragments"])


def test_an_untraceable_models_report_shows_where_it_stopped() -> None:
    trace = failing_trace(patterns.ValueBranch)
    page = framed_page(TraceReport.of(trace, None, "text")._repr_html_())  # type: ignore[arg-type]
    assert_self_contained(page)
    assert "failure" in page_data(page)["nodes"]
    assert "if grid.prod() &gt; 4:" in page or "if grid.prod() \\u003e 4:" in page


def test_a_render_result_shows_the_file_it_wrote(llama_trace: TracedModel, tmp_path: Path) -> None:
    for name in ("overview.html", "overview.svg"):
        result = render_trace(llama_trace, tmp_path / name)
        shown = framed_page(result._repr_html_())
        text = result.path.read_text()
        assert shown == (text if name.endswith(".html") else text[text.index("<svg") :])
