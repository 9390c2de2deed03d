"""The HTML viewer in real headless Chromium: loads cleanly, unfolds in place, searches into
folded parts, colours an overlay, and shows a node's panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmc_trace.render import Overlay, render_trace
from llmc_trace.render.overlay import SCALE
from llmc_trace.traced.model import TracedModel
from tests.render.cdp import Page, find_chromium, open_page

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


def type_search(page: Page, text: str) -> None:
    page.evaluate(
        f"(() => {{ const s = document.getElementById('search'); s.value = {json.dumps(text)};"
        " s.dispatchEvent(new Event('input')); })()"
    )


def rect_of(page: Page, node_id: str) -> list[float]:
    """Where ``node_id`` is in the picture (not on the screen: search pans the view)."""
    return page.evaluate(
        f"(() => {{ const node = document.getElementById({json.dumps(node_id)});"
        " const root = document.querySelector('#canvas svg > g');"
        " const m = root.getScreenCTM().inverse().multiply(node.getScreenCTM());"
        " const b = node.getBBox();"
        " return [b.x * m.a + m.e, b.y * m.d + m.f, b.width, b.height].map(v => +v.toFixed(2));"
        " })()"
    )


def placed(page: Page) -> list[str]:
    """The ids of the nodes the page shows now."""
    return page.evaluate(
        "[...document.querySelectorAll('#canvas g.node')]"
        ".filter(g => g.getBoundingClientRect().width > 0).map(g => g.id)"
    )


def click_node(page: Page, node_id: str) -> None:
    """A click on a node, wherever it is (the same handler a mouse click reaches)."""
    page.evaluate(
        f"document.getElementById({json.dumps(node_id)})"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
    )


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

        # search by node name (the operation, and its reference in each reader's box), then
        # by module path, then by op
        type_search(page, "create_causal_mask")
        readers = [s for s in llama_trace.subgraphs if "create_causal_mask" in s.input_names]
        assert page.evaluate("document.getElementById('search-count').textContent") == (
            f"{1 + len(readers)} matches"
        )
        assert page.evaluate(
            "document.getElementById('n-create_causal_mask').classList.contains('match')"
        )
        type_search(page, "model.layers.2")
        matches = page.evaluate("[...document.querySelectorAll('g.node.match')].map(g => g.id)")
        assert "n-model_layers_2" in matches and "n-model_layers_1" not in matches
        type_search(page, "")

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


def test_the_70b_page_unfolds_in_place_and_search_reveals_folded_nodes(
    llama70b_trace: TracedModel, tmp_path: Path
) -> None:
    path = render_trace(llama70b_trace, tmp_path / "llama70b.html").path
    with open_page(CHROMIUM, path.as_uri()) as page:  # type: ignore[arg-type]
        opening = placed(page)
        assert sorted(opening) == sorted(
            [
                "in-input_ids",
                "in-attention_mask",
                "sg-0",
                "sg-1-79",
                "sg-80",
                "v-create_causal_mask",
            ]
        )
        head, last = rect_of(page, "sg-0"), rect_of(page, "sg-80")

        # a real click on the folded run: its 79 members appear where it was
        page.click(*center_of(page, "sg-1-79"))
        members = {f"sg-{i}" for i in range(1, 80)}
        assert members <= set(placed(page)) and "sg-1-79" not in placed(page)
        assert rect_of(page, "sg-0") == head  # what is above stays where it was
        assert rect_of(page, "sg-80")[1] > last[1]  # what is below makes room

        # one member into its operations, and its layer call into the layer's modules
        click_node(page, "sg-5")
        assert "n-model_layers_4" in placed(page)
        click_node(page, "n-model_layers_4")
        assert {"m-model.layers.4.self_attn", "m-model.layers.4.mlp"} <= set(placed(page))
        assert rect_of(page, "sg-0") == head

        # search finds a module inside a folded part and unfolds what hides it
        type_search(page, "model.layers.40.mlp.down_proj")
        assert page.evaluate("document.getElementById('search-count').textContent") == "1 match"
        assert "m-model.layers.40.mlp.down_proj" not in placed(page)
        page.evaluate("document.getElementById('next').click()")
        target = "m-model.layers.40.mlp.down_proj"
        assert target in placed(page)
        assert page.evaluate(f"document.getElementById('{target}').classList.contains('match')")
        assert page.evaluate("document.getElementById('panel').dataset.node") == target
        panel = page.evaluate("document.getElementById('panel').innerText")
        assert "Linear" in panel and "Subgraph #41" in panel
        page.screenshot(ARTIFACTS / "render-unfolding-page.png")

        # folding the run's title bar puts everything back
        page.evaluate(
            "document.querySelector('g.card-head[data-fold=\"sg-1-79\"]')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        assert sorted(placed(page)) == sorted(opening)
        assert rect_of(page, "sg-80") == last
        assert page.console_errors() == []
        assert page.requested_urls() == [path.as_uri()]


def colour(value: float) -> str:
    """The overlay's colour scale, interpolated here independently of the page's script."""
    at = value * (len(SCALE) - 1)
    low = min(int(at), len(SCALE) - 2)
    mix = at - low
    rgb = [
        round(int(SCALE[low][i : i + 2], 16) * (1 - mix) + int(SCALE[low + 1][i : i + 2], 16) * mix)
        for i in (1, 3, 5)
    ]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def test_an_overlay_colours_boxes_and_explains_them_on_hover(
    llama70b_trace: TracedModel, tmp_path: Path
) -> None:
    loss = {f"model.layers.{i}": round(i / 79, 4) for i in range(80)}
    overlay = Overlay("relative loss", loss, notes={"model.layers.4": "GPTQ 0.031 vs RTN 0.044"})
    path = render_trace(llama70b_trace, tmp_path / "loss.html", overlay=overlay).path

    def fill(page: Page, node_id: str) -> str:
        return page.evaluate(
            f"document.getElementById('{node_id}').querySelector('path, polygon').getAttribute('fill')"
        )

    # the address names what to unfold as the page opens
    with open_page(CHROMIUM, f"{path.as_uri()}#unfold=sg-1-79") as page:  # type: ignore[arg-type]
        assert {f"sg-{i}" for i in range(1, 81)} <= set(placed(page))
        # a folded run shows its worst member (its box is hidden, not gone)
        assert fill(page, "sg-1-79") == colour(max(loss[f"model.layers.{i}"] for i in range(79)))
        assert fill(page, "sg-80") == colour(loss["model.layers.79"])
        assert fill(page, "sg-0") == "#bbdefb"  # the head holds no layer: its own colour
        assert fill(page, "sg-5") == colour(loss["model.layers.4"])
        tooltip = page.evaluate("document.querySelector('#sg-5 > title').textContent")
        assert tooltip == f"relative loss {loss['model.layers.4']:.3g}\nGPTQ 0.031 vs RTN 0.044"
        assert "relative loss" in page.evaluate("document.getElementById('legend').innerText")
        assert page.console_errors() == []
