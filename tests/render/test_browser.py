"""The HTML viewer in real headless Chromium: loads cleanly, searches, and shows a node's panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmc_trace.render import render_trace
from llmc_trace.traced.model import TracedModel
from tests.render.cdp import find_chromium, open_page

CHROMIUM = find_chromium()
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="headless Chromium is not installed: `apt-get install -y chromium` "
        "(scripts/setup.sh installs it)",
    ),
]


@pytest.fixture
def page_path(llama_trace: TracedModel, tmp_path: Path) -> Path:
    return render_trace(llama_trace, tmp_path / "detail.html", view="detail").path


def center_of(page, node_id: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    box = page.evaluate(
        f"(() => {{ const r = document.getElementById({json.dumps(node_id)})"
        ".getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()"
    )
    return box[0], box[1]


def test_viewer_loads_searches_and_shows_a_clicked_node(
    page_path: Path, llama_trace: TracedModel
) -> None:
    with open_page(CHROMIUM, page_path.as_uri()) as page:  # type: ignore[arg-type]
        assert page.evaluate("document.querySelectorAll('#canvas g.node').length") == len(
            json.loads(page.evaluate("document.getElementById('llmc-data').textContent"))["nodes"]
        )

        # search by node name, then by module path, then by op
        page.evaluate(
            "(() => { const s = document.getElementById('search'); s.value = 'create_causal_mask';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        assert page.evaluate("document.getElementById('search-count').textContent") == "1 match"
        assert page.evaluate(
            "document.getElementById('n-create_causal_mask').classList.contains('match')"
        )
        page.evaluate(
            "(() => { const s = document.getElementById('search'); s.value = 'model.layers.2';"
            " s.dispatchEvent(new Event('input')); })()"
        )
        matches = page.evaluate("[...document.querySelectorAll('g.node.match')].map(g => g.id)")
        assert "n-model_layers_2" in matches and "n-model_layers_1" not in matches
        page.evaluate(
            "(() => { const s = document.getElementById('search'); s.value = '';"
            " s.dispatchEvent(new Event('input')); })()"
        )

        # a real mouse click on a node opens its panel with its subgraph's interface
        page.evaluate("document.getElementById('fit').click()")
        page.click(*center_of(page, "n-model_layers_0"))
        panel = page.evaluate("document.getElementById('panel').innerText")
        layer = llama_trace.partitioned.subgraphs[1]  # type: ignore[union-attr]
        assert page.evaluate("document.getElementById('panel').dataset.node") == "n-model_layers_0"
        assert "LlamaDecoderLayer" in panel and "Subgraph #1" in panel
        for name in layer.input_names + layer.consumed_names:
            assert name in panel

        # scrolling zooms in around the pointer
        before = page.evaluate("document.querySelector('#canvas svg').getAttribute('viewBox')")
        x, y = center_of(page, "n-model_layers_0")
        page.send("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0, deltaY=-400)
        after = page.evaluate("document.querySelector('#canvas svg').getAttribute('viewBox')")
        assert float(after.split()[2]) < float(before.split()[2])

        page.screenshot(ARTIFACTS / "render-viewer.png")
        assert page.console_errors() == []
        assert page.requested_urls() == [page_path.as_uri()]
