"""``Overlay``: values per module path become node colours, legends and tooltips on the page."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from llmc_trace.errors import BadInputError
from llmc_trace.render import Overlay, render, render_page
from llmc_trace.traced.model import TracedModel


def page_data(page: str) -> dict:
    return json.loads(re.search(r'id="llmc-data">(.*?)</script>', page).group(1))  # type: ignore[union-attr]


def test_a_box_shows_the_largest_value_of_the_modules_it_stands_for() -> None:
    values = {
        "model.layers.0": 0.25,
        "model.layers.1.mlp.down_proj": 0.5,
        "model.layers.1.mlp.up_proj": 0.75,
    }
    overlay = Overlay("relative loss", values, notes={"model.layers.1.mlp.up_proj": "worst"})
    assert overlay.value_of("model.layers.0") == 0.25
    assert overlay.value_of("model.layers.1") == 0.75  # from below: its worst Linear
    assert overlay.value_of("model.layers.1.mlp.down_proj") == 0.5
    assert overlay.value_of("model.layers.1.self_attn") is None
    assert overlay.describe(["model.layers.0", "model.layers.1"]) == (
        0.75,
        "relative loss 0.75 (model.layers.1.mlp.up_proj)\nworst",
    )
    assert overlay.describe(["model.layers.0"]) == (0.25, "relative loss 0.25")
    assert overlay.describe(["lm_head"]) is None


def test_the_page_carries_each_boxs_value_and_every_valued_path(
    llama70b_trace: TracedModel,
) -> None:
    loss = {f"model.layers.{i}": (i % 7) / 6 for i in range(80)}
    data = page_data(render_page(llama70b_trace, overlay=Overlay("relative loss", loss)))
    overlay = data["overlay"]
    assert overlay["label"] == "relative loss" and overlay["scale"][0].startswith("#")
    assert overlay["nodes"]["sg-1-79"][0] == pytest.approx(
        max(loss[f"model.layers.{i}"] for i in range(79))
    )
    for index in (1, 5, 80):  # a member of the run, unfolded later, and the last layer
        assert overlay["nodes"][f"sg-{index}"][0] == pytest.approx(
            loss[f"model.layers.{index - 1}"]
        )
    assert overlay["nodes"]["n-model_layers_4"][0] == pytest.approx(loss["model.layers.4"])
    assert "sg-0" not in overlay["nodes"]  # the head stands for no layer
    # boxes the page names as it unfolds modules look their paths up
    assert overlay["paths"]["model.layers.33"][0] == pytest.approx(loss["model.layers.33"])
    assert overlay["paths"]["model"][0] == pytest.approx(max(loss.values()))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"model.layers.0": 1.5}, "outside [0, 1]: model.layers.0=1.5"),
        ({"model.layers.0": float("nan")}, "outside [0, 1]"),
        ({"model.layer.3": 0.5}, "names modules the model does not have: model.layer.3"),
    ],
)
def test_bad_values_and_unknown_paths_are_refused(
    llama70b_trace: TracedModel, values: dict, message: str
) -> None:
    with pytest.raises(BadInputError, match=re.escape(message)) as info:
        render_page(llama70b_trace, overlay=Overlay("relative loss", values))
    assert info.value.param == "overlay"
    if "does not have" in message:
        assert "model.layers.3" in info.value.hint  # the closest real path


def test_an_overlay_on_a_file_it_cannot_colour_fails_before_tracing(tmp_path: Path) -> None:
    start = time.perf_counter()
    with pytest.raises(BadInputError, match="colours the overview's HTML page") as info:
        render("no/such-model-is-looked-up", tmp_path / "x.svg", overlay=Overlay("loss", {}))
    assert info.value.param == "overlay"
    assert time.perf_counter() - start < 1.0
