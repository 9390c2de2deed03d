"""The compression report: ``compress`` writes report.json and report.html beside the
checkpoint, with the compressor's own numbers, and ``render --report`` redraws the page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from llmc_trace.cli.main import cli
from llmc_trace.algorithms.baseline import baseline_weight
from llmc_trace.algorithms.scheme import W4A16, QuantizationArgs
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.oneshot.result import CompressionResult
from llmc_trace.report import SCHEMA, VERSION, read_report
from tests.render.cdp import find_chromium, open_page

SAMPLES, SEQ_LEN = 8, 64
CHROMIUM = find_chromium()


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Compress on one thread: the solves are many tiny ops, and on a busy 2-core machine a
    second thread only waits (the reference model took 5 s so, 2 minutes with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def three_bit(
    refmodel_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, CompressionResult]:
    """The reference model compressed by GPTQ to 3 bits (group 128) on 8 rows of 64 tokens:
    the checkpoint folder and the run's result."""
    out = tmp_path_factory.mktemp("report") / "w3"
    result = compress(
        CompressRequest(
            str(refmodel_dir),
            dataset=refmodel_dir / "calib.npy",
            out_dir=out,
            scheme=W4A16.with_weights(num_bits=3),
            samples=SAMPLES,
            seq_len=SEQ_LEN,
        )
    )
    return out, result


def test_report_json_holds_the_compressors_numbers_for_every_layer(
    three_bit: tuple[Path, CompressionResult],
) -> None:
    out, result = three_bit
    document = json.loads((out / "report.json").read_text())
    assert document["schema"] == SCHEMA and document["version"] == VERSION
    (stage,) = document["settings"]["stages"]
    assert stage["method"] == "gptq" and stage["weights"]["num_bits"] == 3
    assert stage["pipeline"] == result.pipeline == "sequential"
    assert (document["settings"]["samples"], document["settings"]["seq_len"]) == (8, 64)
    assert (document["settings"]["tokens"], document["settings"]["media_tokens"]) == (8 * 64, 0)

    rows = document["layers"]
    assert [row["name"] for row in rows] == [layer.name for layer in result.layers]
    assert len(rows) == 42  # 7 linear layers in each of 6 decoder layers; lm_head ignored
    for row, layer in zip(rows, result.layers, strict=True):
        assert row["loss"] == layer.loss  # the very float the compressor computed
        assert row["baseline_loss"] == layer.baseline_loss
        assert row["shares_hessian_with"] == layer.shares_hessian_with
        assert row["num_tokens"] == SAMPLES * SEQ_LEN  # no padding: every token counts
        assert row["relative_loss"] == layer.loss / layer.baseline_loss
        assert row["device_peak_bytes"] is None  # a CPU run measures no per-layer peak
        block, _, last = row["name"].rpartition(".")
        fused = {"q_proj": "q_proj k_proj v_proj", "k_proj": "q_proj k_proj v_proj",
                 "v_proj": "q_proj k_proj v_proj", "gate_proj": "gate_proj up_proj",
                 "up_proj": "gate_proj up_proj"}.get(last, last)  # fmt: skip
        assert row["ignore"] == " ".join(f"--ignore {block}.{p}" for p in fused.split())
        # each layer sits in the subgraph that runs its decoder layer
        (subgraph,) = [s for s in document["subgraphs"] if s["index"] == row["subgraph"]]
        assert subgraph["targets"] == [row["name"].rsplit(".", 2)[0]]
    assert read_report(out / "report.json") == result.report


def test_three_bit_gptq_beats_round_to_nearest_on_every_layer(
    three_bit: tuple[Path, CompressionResult],
) -> None:
    """Both losses are the same quantity (tests/algorithms/test_baseline.py): at 3 bits GPTQ
    leaves a fraction of round-to-nearest's error, far beyond float noise, in every layer."""
    report = read_report(three_bit[0] / "report.json")
    assert report.layers and all(row.baseline == "rtn" for row in report.layers)
    losing = [row.name for row in report.layers if not row.loss < row.baseline_loss]
    assert losing == []
    assert (
        report.summary()[0]["worst"][0]
        == max(report.layers, key=lambda row: row.relative_loss).name
    )


def test_render_redraws_the_page_compress_wrote(
    three_bit: tuple[Path, CompressionResult], tmp_path: Path
) -> None:
    out = three_bit[0]
    pages = []
    for name in ("first.html", "second.html"):
        code = CliRunner().invoke(
            cli,
            [
                "--quiet",
                "render",
                "--report",
                str(out / "report.json"),
                "-o",
                str(tmp_path / name),
            ],
        )
        assert code.exit_code == 0, code.output
        pages.append((tmp_path / name).read_bytes())
    assert pages[0] == pages[1] == (out / "report.html").read_bytes()
    page = pages[0].decode()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    assert "default-src 'none'" in page  # nothing may be fetched


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed: `apt-get install -y chromium`",
)
def test_the_page_opens_lists_the_worst_first_and_filters_by_box(
    three_bit: tuple[Path, CompressionResult],
) -> None:
    report = read_report(three_bit[0] / "report.json")
    page_path = three_bit[0] / "report.html"
    with open_page(CHROMIUM, page_path.as_uri()) as page:  # type: ignore[arg-type]
        names = page.evaluate(
            "[...document.querySelectorAll('#layer-table tbody tr')].map(r => r.cells[0].textContent)"
        )
        assert names == [row.name for row in report.worst()]
        assert page.evaluate("document.querySelectorAll('#overview g.node').length") == len(
            report.subgraphs
        )
        # clicking a box's title lists that subgraph's layers only
        box = page.evaluate(
            "(() => { const r = document.querySelector('#sg-3 text').getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        page.click(*box)
        shown = page.evaluate(
            "[...document.querySelectorAll('#layer-table tbody tr:not([hidden])')]"
            ".map(r => r.cells[0].textContent)"
        )
        assert sorted(shown) == sorted(row.name for row in report.layers if row.subgraph == 3)
        assert len(shown) == 7
        page.evaluate("document.getElementById('show-all').click()")
        assert page.evaluate(
            "document.querySelectorAll('#layer-table tbody tr:not([hidden])').length"
        ) == len(report.layers)
        assert page.console_errors() == []
        assert page.requested_urls() == [page_path.as_uri()]


def test_an_in_memory_run_writes_nothing_and_returns_the_report(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """SparseGPT at 50 % that also quantizes: its baseline is magnitude pruning then
    round-to-nearest, and the first layer's baseline loss is the damped error of that baseline
    under the Hessian of its inputs, computed here from the model itself."""
    folder, data = saved_llama
    args = QuantizationArgs(num_bits=4)  # group 128 and no actorder, SparseGPT's order
    before = sorted(tmp_path.rglob("*"))
    result = compress(
        CompressRequest(
            str(folder),
            dataset=data,
            out_dir=None,
            method="sparsegpt",
            sparsity=0.5,
            scheme=W4A16.with_weights(actorder=None),
            samples=8,
            seq_len=64,
        )
    )
    assert sorted(tmp_path.rglob("*")) == before
    rows = result.report.layers
    assert [row.name for row in rows] == [layer.name for layer in result.layers]
    assert [row.loss for row in rows] == [layer.loss for layer in result.layers]
    assert {row.baseline for row in rows} == {"magnitude+rtn"}

    # the first layer's inputs do not depend on the compression: all 8 rows, normalized
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.as_tensor(np.load(data), dtype=torch.long)
    with torch.no_grad():
        X = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    X = X.reshape(-1, X.shape[-1]).double()
    H = 2 * X.T @ X / X.shape[0]
    H_d = H + 0.01 * H.diag().mean() * torch.eye(H.shape[0], dtype=H.dtype)
    q_proj = "model.layers.0.self_attn.q_proj"
    W = model.get_submodule(q_proj).weight.detach()
    D = (W - baseline_weight(W, args, 0.5)).double()
    (row,) = [row for row in rows if row.name == q_proj]
    assert row.num_tokens == X.shape[0]
    assert row.baseline_loss == pytest.approx((torch.trace(D @ H_d @ D.T) / 2).item(), rel=1e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_records_each_solves_peak_and_keeps_the_runs(
    saved_llama: tuple[Path, Path],
) -> None:
    """Each solve holds at least its float32 Hessian and weight on the device, and the run's
    peak survives the per-solve resets of CUDA's counter."""
    folder, data = saved_llama
    torch.cuda.reset_peak_memory_stats()
    result = compress(
        CompressRequest(str(folder), dataset=data, out_dir=None, samples=8, seq_len=64),
        device=torch.device("cuda"),
    )
    report = result.report
    assert report.device == "cuda"
    model = AutoModelForCausalLM.from_pretrained(folder)
    for row in report.layers:
        out_features, in_features = model.get_submodule(row.name).weight.shape
        assert row.device_peak_bytes is not None
        assert row.device_peak_bytes >= 4 * (in_features * in_features + out_features * in_features)
    assert report.device_peak_bytes is not None
    assert report.device_peak_bytes >= max(row.device_peak_bytes or 0 for row in report.layers)


def test_expert_rows_name_their_fallback_and_their_shared_hessian(tmp_path: Path) -> None:
    """Experts routed too few tokens are rounded to nearest: their rows say so and claim no
    loss; the others are GPTQ's, each expert's up projection sharing its gate's Hessian."""
    from tests.test_moe import W4_CHANNEL, _tiny_qwen3_moe

    folder = _tiny_qwen3_moe(tmp_path / "moe")
    out = tmp_path / "out"
    result = compress(
        CompressRequest(
            folder,
            dataset=folder / "calib.npy",
            out_dir=out,
            samples=2,
            seq_len=8,
            scheme=W4_CHANNEL,
            expert_tokens="routed",
        )
    )
    rows = {row.name: row for row in read_report(out / "report.json").layers}
    experts = [layer for layer in result.layers if ".experts." in layer.name]
    fallen = [layer for layer in experts if layer.fallback]
    assert 0 < len(fallen) < len(experts)
    for layer in experts:
        row = rows[layer.name]
        assert row.subgraph is not None and row.fallback == layer.fallback
        if layer.fallback:
            assert (row.method, row.loss, row.baseline_loss) == ("rtn", None, None)
        else:
            assert row.method == "gptq" and row.relative_loss is not None
        if layer.name.endswith("up_proj"):
            assert row.shares_hessian_with == layer.name.replace("up_proj", "gate_proj")
