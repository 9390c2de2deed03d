"""The source view: model code as the trace ran it, in headless Chromium (no console error, no
request) with a node -> line -> node round trip by real clicks, and refused as a picture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmc_trace.errors import BadInputError
from llmc_trace.render import render_trace
from llmc_trace.traced.model import TracedModel, trace_source
from tests.render.cdp import Page, find_chromium, open_page

CHROMIUM = find_chromium()


@pytest.fixture(scope="module")
def recorded_trace(llama_dir: Path) -> TracedModel:
    return trace_source(str(llama_dir), record_decisions=True)


def click(page: Page, selector: str) -> None:
    """A real mouse click on the element ``selector`` finds, scrolled into view first."""
    x, y = page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
        " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    page.click(x, y)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_source_page_links_a_node_to_its_line_and_back(
    recorded_trace: TracedModel, tmp_path: Path
) -> None:
    path = render_trace(recorded_trace, tmp_path / "source.html", view="source").path
    node = next(
        n for n in recorded_trace.trace.graph.nodes if n.name.startswith("create_causal_mask")
    )
    where = node.meta["source"]
    with open_page(CHROMIUM, path.as_uri()) as page:  # type: ignore[arg-type]
        # the layers loop is coloured as a config decision; its line holds the loop's source
        loops = page.evaluate(
            "[...document.querySelectorAll('tr.st-config td.src')].map(td => td.textContent)"
        )
        assert any("for decoder_layer in self.layers" in text for text in loops)

        click(page, f"#node-{node.name} a.line")
        line = page.evaluate("location.hash")
        assert line.startswith("#L-") and line.endswith(f"-{where.line}")
        row = f'[id="{line[1:]}"]'  # a function's name holds dots: no #id selector
        assert where.code in page.evaluate(f"document.querySelector('{row} td.src').textContent")
        click(page, f"{row} a.node[href='#node-{node.name}']")
        assert page.evaluate("location.hash") == f"#node-{node.name}"
        assert page.evaluate("document.querySelector(':target').id") == f"node-{node.name}"
        assert page.console_errors() == []
        assert page.requested_urls() == [path.as_uri()]


def test_source_view_is_a_page_not_a_picture(recorded_trace: TracedModel, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="not \\*.html"):
        render_trace(recorded_trace, tmp_path / "source.svg", view="source")


def test_the_failure_box_points_at_its_line_in_the_source_view(tmp_path: Path) -> None:
    """Qwen2-VL with an image stops in get_rope_index: the failure view's box names the source
    view's anchor of that line, and the source page marks that very line as where it stopped."""
    from llmc_trace.render.failure import FAILURE_ID, draw_failure

    failed = trace_source("Qwen/Qwen2-VL-2B-Instruct", modality="image", record_decisions=True)
    fields = dict(draw_failure(failed).nodes[FAILURE_ID].fields)
    anchor = fields["source view"].split("(at #")[1].rstrip(")")
    page = render_trace(failed, tmp_path / "source.html", view="source").path.read_text()
    assert f'<tr id="{anchor}" class="st-value stopped">' in page
    assert "tracing stopped here" in page


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_overview_page_lists_the_decisions_in_its_panel(
    recorded_trace: TracedModel, tmp_path: Path
) -> None:
    path = render_trace(recorded_trace, tmp_path / "overview.html").path
    with open_page(CHROMIUM, path.as_uri()) as page:  # type: ignore[arg-type]
        click(page, "#decisions")
        panel = page.evaluate("document.getElementById('panel').innerText")
        assert f"Decisions ({len(recorded_trace.decisions)})" in panel
        assert "config.num_hidden_layers = 3" in panel
        shown = page.evaluate("[...document.querySelectorAll('#panel .decision')].length")
        assert shown == len(recorded_trace.decisions) > 0
        assert page.console_errors() == []
