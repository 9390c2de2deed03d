"""``render --report``: the overview and the page from a report.json, and a clear error for
anything else."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmc_trace.cli.main import cli
from llmc_trace.report import (
    CompressionReport,
    LayerRow,
    ReportSettings,
    StageSettings,
    SubgraphRow,
)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "160", "NO_COLOR": "1"})
    return result.exit_code, result.output


def row(name: str, loss: float, baseline: float, subgraph: int) -> LayerRow:
    return LayerRow(
        name=name,
        stage=0,
        method="gptq",
        baseline="rtn",
        loss=loss,
        baseline_loss=baseline,
        num_tokens=512,
        seconds=0.5,
        device_peak_bytes=None,
        shares_hessian_with=None,
        subgraph=subgraph,
        fallback=None,
        ignore=f"--ignore {name}",
    )


@pytest.fixture
def report_file(tmp_path: Path) -> Path:
    """A two-layer report, written as compress writes it."""
    report = CompressionReport(
        model="tiny",
        device="cpu",
        device_peak_bytes=None,
        settings=ReportSettings(
            "calib.npy",
            8,
            64,
            1,
            0,
            "bfloat16",
            (StageSettings("gptq", "W4A16", {"num_bits": 4}, None, "sequential", 0, 0.01),),
        ),
        subgraphs=(SubgraphRow(0, ()), SubgraphRow(1, ("model.layers.0",))),
        layers=(
            row("model.layers.0.self_attn.q_proj", 1.0, 4.0, 1),
            row("model.layers.0.mlp.down_proj", 3.0, 4.0, 1),
        ),
    )
    path = tmp_path / "report.json"
    path.write_text(report.dumps())
    return path


def test_render_report_draws_the_overview_and_the_page(report_file: Path, tmp_path: Path) -> None:
    code, output = invoke("render", "--report", str(report_file), "-o", str(tmp_path / "r.svg"))
    assert code == 0, output
    assert "compression report overview, 2 layers" in output
    svg = html.unescape((tmp_path / "r.svg").read_text())  # dot writes "-" as &#45;
    assert 'id="sg-1"' in svg and "down_proj" in svg and "0.750" in svg
    code, output = invoke("render", "--report", str(report_file), "-o", str(tmp_path / "r.html"))
    assert code == 0, output
    page = (tmp_path / "r.html").read_text()
    table = page[page.index('id="layer-table"') :]
    # the worst layer (3/4 of its baseline's loss) comes first, with the option to keep it
    assert table.index("model.layers.0.mlp.down_proj") < table.index(
        "model.layers.0.self_attn.q_proj"
    )
    assert "--ignore model.layers.0.mlp.down_proj --ignore model.layers.0.self_attn.q_proj" in page


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda text: text[:-20], "it is not JSON"),
        (lambda text: text.replace('"llmc-trace/compression-report"', '"other"'), "schema"),
        (lambda text: text.replace('"version": 1', '"version": 9'), "version 9"),
        (lambda text: text.replace('"num_tokens"', '"tokens"'), "`num_tokens` of"),
        (lambda text: text.replace('"samples": 8', '"samples": "8"'), "`samples` is '8', not int"),
        (lambda text: text.replace('"stage": 0,\n      "', '"stage": 3,\n      "'), "stage 3"),
    ],
    ids=["truncated", "schema", "version", "missing-key", "wrong-type", "stage"],
)
def test_a_bad_report_exits_2_saying_what_is_wrong(
    report_file: Path, tmp_path: Path, change, message: str
) -> None:
    report_file.write_text(change(report_file.read_text()))
    code, output = invoke("render", "--report", str(report_file), "-o", str(tmp_path / "r.html"))
    assert code == 2, output
    text = " ".join(output.split())
    assert "--report" in text and message in text and "Traceback" not in output
    assert not (tmp_path / "r.html").exists()


def test_render_needs_a_model_or_a_report_not_both(report_file: Path, tmp_path: Path) -> None:
    code, output = invoke("render", "-o", str(tmp_path / "r.html"))
    assert code == 2 and "--model" in output
    code, output = invoke(
        "render", "--report", str(report_file), "-m", "llama", "-o", str(tmp_path / "r.html")
    )
    assert code == 2 and "do not apply to --report" in " ".join(output.split())
