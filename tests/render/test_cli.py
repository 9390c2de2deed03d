"""``llmc-trace render``: exit codes 0 (written), 1 (not traceable), 2 (bad input)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import llmc_trace.cli.main  # first: render_cmd imports the group's shared options from it
import llmc_trace.render.api
from llmc_trace.cli.context import CliContext
from llmc_trace.cli.render_cmd import render
from llmc_trace.traced.model import TracedModel
from tests.patterns import untraceable as patterns
from tests.render.helpers import failing_trace, svg_nodes


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(render, list(args), obj=CliContext(quiet=True))
    return result.exit_code, result.output


def test_render_writes_the_file_and_says_so(llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "detail.svg"
    code, output = invoke(
        "--model", str(llama_dir), "--out", str(out), "--view", "detail", "--subgraphs", "0,2-3"
    )
    assert code == 0, output
    assert "Wrote" in output and "detail view" in output
    nodes = svg_nodes(out.read_text())
    assert "n-model_layers_1" in nodes and "n-model_layers_0" not in nodes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "picture.png"], "no .svg or .html extension"),
        (["--out", "x.svg", "--view", "everything"], "'everything' is not one of"),
        (["--out", "x.svg", "--view", "detail", "--subgraphs", "2-a"], "not a subgraph number"),
        (["--out", "x.svg", "--subgraphs", "1"], "applies to the detail view"),
        (["--out", "x.svg", "--view", "detail", "--subgraphs", "40"], "Subgraph 40 does not exist"),
        (["--out", "x.svg", "--view", "failure"], "traced without failure"),
    ],
)
def test_bad_input_exits_2(llama_dir: Path, tmp_path: Path, args: list[str], message: str) -> None:
    args = [a if not a.endswith((".svg", ".png")) else str(tmp_path / a) for a in args]
    code, output = invoke("--model", str(llama_dir), *args)
    assert code == 2, output
    assert message in " ".join(output.split())


@pytest.fixture
def untraceable(monkeypatch: pytest.MonkeyPatch) -> TracedModel:
    """Every model name traces as the ValueBranch pattern (real configs may become traceable)."""
    trace = failing_trace(patterns.ValueBranch)
    monkeypatch.setattr(llmc_trace.render.api, "trace_source", lambda model, **kwargs: trace)
    return trace


def test_untraceable_model_exits_1_and_points_at_the_failure_view(
    untraceable: TracedModel, tmp_path: Path
) -> None:
    out = tmp_path / "overview.svg"
    code, output = invoke("--model", "any/model", "--out", str(out))
    assert code == 1
    assert "not traceable" in output and "--view failure" in " ".join(output.split())
    assert not out.exists()


def test_failure_view_of_an_untraceable_model_exits_0(
    untraceable: TracedModel, tmp_path: Path
) -> None:
    out = tmp_path / "failure.svg"
    code, output = invoke("--model", "any/model", "--out", str(out), "--view", "failure")
    assert code == 0, output
    assert len(svg_nodes(out.read_text())) == len(untraceable.partial_graph.nodes) + 1  # type: ignore[union-attr]


def test_missing_dot_exits_1_with_the_install_hint(
    llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, output = invoke("--model", str(llama_dir), "--out", str(tmp_path / "x.svg"))
    assert code == 1
    assert "apt-get install -y graphviz" in output
