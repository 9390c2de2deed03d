"""Deep models by default: folded SVG views that stay readable, and ``--expand`` for every member.

The two built-ins are the deepest text models users draw: Llama-3.1-70B (80 identical layers)
and DeepSeek-V3 (3 dense layers, then 58 MoE layers). Drawn one member at a time their detail
view was 12,062 pt wide and their modules view 39,107 pt tall.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import llmc_trace.cli.main  # noqa: F401  (first: render_cmd imports the group's options from it)
from llmc_trace.cli.context import CliContext
from llmc_trace.cli.render_cmd import render
from llmc_trace.render import draw, render_svg
from llmc_trace.traced.model import TracedModel
from tests.render.helpers import svg_clusters, svg_nodes, svg_size

#: The most either side of a default picture may measure, in points.
LONG_SIDE_PT = 5000


@pytest.mark.parametrize("model", ["llama70b_trace", "deepseek_v3_trace"])
@pytest.mark.parametrize("view", ["detail", "modules"])
def test_default_views_of_deep_models_are_taller_than_wide_and_under_5000_pt(
    request: pytest.FixtureRequest, model: str, view: str
) -> None:
    trace: TracedModel = request.getfixturevalue(model)
    width, height = svg_size(render_svg(draw(trace, view)))
    assert width < height < LONG_SIDE_PT, f"{trace.name} {view}: {width} x {height} pt"


def test_deepseek_dense_and_moe_layers_fold_apart(deepseek_v3_trace: TracedModel) -> None:
    """A dense layer and an MoE layer are each one call, yet not interchangeable."""
    mlp_classes = [
        type(layer.mlp).__name__
        for layer in deepseek_v3_trace.model.model.layers  # type: ignore[union-attr]
    ]
    dense = mlp_classes.count(mlp_classes[0])
    assert 0 < dense < len(mlp_classes)
    nodes = svg_nodes(render_svg(draw(deepseek_v3_trace, "overview")))
    last = len(mlp_classes)
    assert {"sg-0", f"sg-1-{dense}", f"sg-{dense + 1}-{last - 1}", f"sg-{last}"} <= set(nodes)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(render, list(args), obj=CliContext(quiet=True))
    return result.exit_code, result.output


def test_expand_draws_every_member(llama70b_trace: TracedModel, tmp_path: Path) -> None:
    """``--expand``: a cluster for each of the 81 subgraphs, a box for each of the modules."""
    model = "meta-llama/Llama-3.1-70B"
    detail, modules = tmp_path / "detail.svg", tmp_path / "modules.svg"
    for view, out in (("detail", detail), ("modules", modules)):
        code, output = invoke("--model", model, "--view", view, "--expand", "--out", str(out))
        assert code == 0, output
    clusters = svg_clusters(detail.read_text())
    assert {f"cluster_sg{s.index}" for s in llama70b_trace.subgraphs} <= set(clusters)
    assert len(svg_nodes(modules.read_text())) == len(list(llama70b_trace.model.modules()))
    code, output = invoke("--model", model, "--view", "modules", "--out", str(modules))
    assert code == 0, output
    folded = svg_nodes(modules.read_text())
    assert "m-model.layers.0" in folded and "m-model.layers.1" not in folded
