"""Several stages in one run: SparseGPT 2:4 over the whole model, then GPTQ W4A16 over the
pruned one, streamed to a checkpoint whose recipe.yaml runs the same run again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

from llmc_trace.cli.main import cli
from llmc_trace.algorithms import W4A16
from llmc_trace.oneshot import CompressRequest, Stage, compress

PRUNE_THEN_QUANTIZE = (Stage("sparsegpt", None, (2, 4)), Stage("gptq", W4A16))
BASELINE = (Stage("magnitude", None, (2, 4)), Stage("rtn", W4A16))


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.Tensor]:
    """A tiny Llama whose layers are 128 wide, 32 calibration rows, 8 held-out rows."""
    from tests.conftest import tiny_llama

    folder = tmp_path_factory.mktemp("model") / "tiny"
    tiny_llama(layers=2, hidden=128).save_pretrained(folder)
    rows = np.random.default_rng(1).integers(0, 128, size=(40, 64))
    np.save(folder.parent / "calib.npy", rows[:32])
    return folder, folder.parent / "calib.npy", torch.as_tensor(rows[32:])


def run(folder: Path, data: Path, out: Path, stages: tuple[Stage, ...]) -> None:
    compress(CompressRequest(folder, data, out, stages=stages, samples=32, seq_len=64))


def load(folder: Path) -> torch.nn.Module:
    """A checkpoint as transformers reads it, its integers dequantized while loading."""
    dequantize = CompressedTensorsConfig(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=dequantize).eval()


def logits(folder: Path, rows: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return load(folder)(rows).logits


def quantized_weights(folder: Path) -> dict[str, torch.Tensor]:
    model = load(folder)
    return {
        name: module.weight.detach()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }


def test_pruning_then_quantizing_keeps_the_mask_and_beats_the_baselines(
    model_and_data: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    folder, data, held_out = model_and_data
    run(folder, data, tmp_path / "two-stage", PRUNE_THEN_QUANTIZE)
    run(folder, data, tmp_path / "baseline", BASELINE)

    weights = quantized_weights(tmp_path / "two-stage")
    assert len(weights) == 14
    for name, weight in weights.items():
        zeros_per_four = (weight.reshape(weight.shape[0], -1, 4) == 0).sum(-1)
        assert (zeros_per_four >= 2).all(), name  # no pruned weight came back

    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(folder).eval()(held_out).logits
    errors = {
        name: (logits(tmp_path / name, held_out) - reference).pow(2).mean().item()
        for name in ("two-stage", "baseline")
    }
    # measured 0.0087 against 0.0162 (0.54x); float order moves either by far less than 0.7x does
    assert errors["two-stage"] < 0.7 * errors["baseline"], errors

    text = (tmp_path / "two-stage" / "recipe.yaml").read_text()
    assert text.count("- method:") == 2 and 'sparsity: "2:4"' in text


def test_the_written_recipe_reproduces_the_checkpoint_byte_for_byte(
    model_and_data: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    folder, data, _ = model_and_data
    first = tmp_path / "first"
    compress(  # a dtype other than the model's: the recipe must carry it too
        CompressRequest(
            folder,
            data,
            first,
            stages=PRUNE_THEN_QUANTIZE,
            samples=32,
            seq_len=64,
            dtype=torch.bfloat16,
            max_shard_size=100_000,
        )
    )
    assert len(list(first.glob("*.safetensors"))) > 1
    again = tmp_path / "again"
    compress(CompressRequest.from_recipe(first / "recipe.yaml", folder, again))
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    # the report is the same but for what it measured (seconds, memory peaks); its page,
    # drawn from it, shows them too
    assert unmeasured(first / "report.json") == unmeasured(again / "report.json")
    for name in [name for name in names if not name.startswith("report.")]:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert not list(tmp_path.glob(".*")), "an intermediate stage folder was left behind"


def unmeasured(report: Path) -> dict:
    """A report.json without the seconds and device peaks it measured."""
    document = json.loads(report.read_text())
    measured = ("seconds", "device_peak_bytes")
    for part in (document, *document["layers"], *document["summary"]):
        for key in measured:
            part.pop(key, None)
    return document


def test_streamed_stages_give_the_in_memory_model(
    model_and_data: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    folder, data, held_out = model_and_data
    run(folder, data, tmp_path / "out", PRUNE_THEN_QUANTIZE)
    in_memory = compress(
        CompressRequest(folder, data, None, stages=PRUNE_THEN_QUANTIZE, samples=32, seq_len=64)
    )
    assert [s.stage.method for s in in_memory.stages] == ["sparsegpt", "gptq"]
    with torch.no_grad():
        expected = in_memory.model(held_out).logits
    torch.testing.assert_close(logits(tmp_path / "out", held_out), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("recipe", "key"),
    [
        ("stages:\n  - {method: gptq, scheme: W4A16, colour: blue}\n", "colour"),
        ("stages:\n  - {method: sparsegpt, sparsity: 1.5}\n", "sparsity"),
        ("stages: []\n", "stages"),
    ],
)
def test_a_bad_recipe_exits_2_naming_the_key_and_writes_nothing(
    model_and_data: tuple[Path, Path, torch.Tensor], tmp_path: Path, recipe: str, key: str
) -> None:
    folder, data, _ = model_and_data
    (tmp_path / "recipe.yaml").write_text(recipe)
    out = tmp_path / "out"
    arguments = [
        "compress",
        "-m",
        str(folder),
        "-d",
        str(data),
        "-r",
        str(tmp_path / "recipe.yaml"),
    ]
    result = CliRunner().invoke(cli, ["--quiet", *arguments, "-o", str(out)], env={"NO_COLOR": "1"})
    assert result.exit_code == 2, result.output
    assert f"`{key}`" in result.output and "line" in result.output
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["recipe.yaml"]


def test_flags_override_a_one_stage_recipe(
    model_and_data: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    folder, data, _ = model_and_data
    (tmp_path / "recipe.yaml").write_text(
        f"calibration: {{dataset: {str(data)!r}, samples: 8, seq_len: 64}}\n"
        "stages:\n  - {method: gptq, scheme: W4A16}\n"
    )
    request = CompressRequest.from_recipe(
        tmp_path / "recipe.yaml", folder, None, samples=16, method="rtn"
    )
    assert request.calibration.samples == 16 and request.calibration.seq_len == 64
    assert request.stages == (Stage("rtn", W4A16),)


def test_a_preset_named_for_sparsegpt_comes_without_act_order() -> None:
    """SparseGPT sweeps columns in input order: ``--sparsity 2:4 --scheme W4A16`` quantizes
    while pruning, where GPTQ keeps the act-order the project adds to every preset."""
    pruning = Stage("sparsegpt", "W4A16", (2, 4))
    assert pruning.scheme is not None and pruning.scheme.weights.actorder is None
    assert Stage("gptq", "W4A16").scheme.weights.actorder == "static"  # type: ignore[union-attr]
    assert pruning.scheme == W4A16.with_weights(actorder=None)
