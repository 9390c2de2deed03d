"""``render --report`` and the report's part of ``compress``: its console lines, and ``--ignore``,
the option the report offers for keeping a layer in full precision."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from llmc_trace.cli.main import cli
from llmc_trace.report import (
    CompressionReport,
    LayerRow,
    ReportSettings,
    StageSettings,
    SubgraphRow,
    read_report,
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
            (
                StageSettings(
                    "gptq", "W4A16", {"num_bits": 4}, None, "sequential", {"percdamp": 0.05}
                ),
            ),
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


def edited(text: str, change: Callable[[dict[str, Any]], object]) -> str:
    """``report.json``'s text after ``change`` edits its document (Python's JSON writes NaN
    and Infinity as the bare words, as a hand-edited or foreign report may hold them)."""
    document = json.loads(text)
    change(document)
    return json.dumps(document)


def empty_run(document: dict[str, Any]) -> None:
    document["settings"]["stages"] = []
    document["layers"] = []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda text: text[:-20], "it is not JSON"),
        (lambda text: text.replace('"llmc-trace/compression-report"', '"other"'), "schema"),
        (lambda text: text.replace('"version": 1', '"version": 9'), "version 9"),
        (lambda text: text.replace('"num_tokens"', '"tokens"'), "`num_tokens` of"),
        (lambda text: text.replace('"samples": 8', '"samples": "8"'), "`samples` is '8', not int"),
        (lambda text: text.replace('"stage": 0,\n      "', '"stage": 3,\n      "'), "stage 3"),
        (lambda text: edited(text, empty_run), "it lists no stages"),
        (lambda text: edited(text, lambda d: d.update(layers=[])), "it lists no layers"),
        (
            lambda text: edited(text, lambda d: d["layers"][0].update(loss=math.nan)),
            "`loss` of model.layers.0.self_attn.q_proj is nan, not a finite number >= 0",
        ),
        (
            lambda text: edited(
                text, lambda d: d["layers"][1].update(loss=math.inf, baseline_loss=math.inf)
            ),
            "`loss` of model.layers.0.mlp.down_proj is inf, not a finite number >= 0",
        ),
        (
            lambda text: edited(text, lambda d: [row.update(subgraph=99) for row in d["layers"]]),
            "layer model.layers.0.self_attn.q_proj names subgraph 99, and it holds subgraphs 0-1",
        ),
        (
            lambda text: edited(
                text, lambda d: d["layers"][1].update(shares_hessian_with="model.layers.7.mlp")
            ),
            "shares a Hessian with model.layers.7.mlp, a layer it does not list",
        ),
    ],
    ids=[
        "truncated",
        "schema",
        "version",
        "missing-key",
        "wrong-type",
        "stage",
        "no-stages-no-layers",
        "no-layers",
        "nan-loss",
        "infinite-losses",
        "absent-subgraph",
        "absent-layer",
    ],
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


@pytest.mark.usefixtures("one_thread")
def test_compress_prints_the_worst_layers_and_ignore_keeps_one_dense(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    common = ["compress", "-m", str(folder), "-d", str(data), "--samples", "8", "--seq-len", "64"]
    code, output = invoke(*common, "-o", str(tmp_path / "all"))
    assert code == 0, output
    report = read_report(tmp_path / "all" / "report.json")
    worst = report.worst(1)[0]
    assert "highest relative loss" in output and worst.name in output
    assert f"{worst.relative_loss:.3f}" in output
    assert f"{tmp_path / 'all'}/report.html" in "".join(output.split())

    # the options the report offers for the worst layer keep it, and the layers vLLM fuses
    # with it, out of the next run
    options = worst.ignore.split()  # type: ignore[union-attr]
    dense = options[1::2]
    assert worst.name in dense and len(dense) in (1, 2, 3)
    code, output = invoke(*common, "-o", str(tmp_path / "kept"), *options)
    assert code == 0, output
    kept = tmp_path / "kept"
    names = [r.name for r in read_report(kept / "report.json").layers]
    assert not set(dense) & set(names) and len(names) == len(report.layers) - len(dense)
    config = json.loads((kept / "config.json").read_text())
    assert set(dense) <= set(config["quantization_config"]["ignore"])
    (stage,) = yaml.safe_load((kept / "recipe.yaml").read_text())["stages"]
    assert set(dense) <= set(stage["scheme"]["ignore"])


@pytest.mark.usefixtures("one_thread")
def test_ignoring_part_of_a_fused_layer_keeps_the_whole_layer(
    saved_llama: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM fuses q, k and v into one layer and refuses one in two schemes."""
    folder, data = saved_llama
    attention = "model.layers.0.self_attn"
    code, output = invoke(
        "compress", "-m", str(folder), "-d", str(data), "-o", str(tmp_path / "out"),
        "--samples", "8", "--seq-len", "64", "--method", "rtn", "--ignore", f"{attention}.q_proj",
    )  # fmt: skip
    assert code == 0, output
    assert "vLLM serves 2 layers" in caplog.text
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    ignored = config["quantization_config"]["ignore"]
    assert {f"{attention}.{p}" for p in ("q_proj", "k_proj", "v_proj")} <= set(ignored)
    assert f"{attention}.o_proj" not in ignored and "model.layers.1.self_attn.k_proj" not in ignored


def test_ignore_in_a_run_that_only_prunes_exits_2(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    code, output = invoke(
        "compress", "-m", str(folder), "-d", str(data), "-o", str(tmp_path / "out"),
        "--samples", "8", "--seq-len", "64", "--scheme", "none", "--sparsity", "0.5",
        "--ignore", "lm_head",
    )  # fmt: skip
    assert code == 2 and "only prunes" in output
    assert not (tmp_path / "out").exists()
