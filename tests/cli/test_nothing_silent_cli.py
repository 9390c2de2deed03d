"""Nothing silently wrong (issue 37): a NaN or inf where values enter, token ids outside the
vocabulary and recipe values of the wrong kind each end the command with one sentence naming
what is wrong and what to do, its exit code, no traceback and nothing left behind; a failure
after calibration leaves an existing checkpoint byte for byte as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from llmc_trace.cli.main import cli
from refmodel import FOLDER as REFMODEL

NAN, INF = float("nan"), float("inf")
pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def changed(folder: Path, out: Path, change: dict[str, torch.Tensor]) -> Path:
    """A copy of the checkpoint ``folder`` at ``out`` with the tensors of ``change`` replaced."""
    shutil.copytree(folder, out)
    tensors = load_file(out / "model.safetensors")
    tensors.update(change)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def with_value(folder: Path, out: Path, name: str, value: float) -> Path:
    """The checkpoint with one value of tensor ``name`` replaced by ``value``."""
    tensor = load_file(folder / "model.safetensors")[name].clone()
    tensor[3, 5] = value
    return changed(folder, out, {name: tensor})


def overflowing(folder: Path, out: Path) -> Path:
    """Finite weights whose forward pass overflows float32: layer 0's gate and up projections
    scaled by 1e25, so their product (the input of its down projection) is inf."""
    tensors = load_file(folder / "model.safetensors")
    names = [f"model.layers.0.mlp.{part}.weight" for part in ("gate_proj", "up_proj")]
    return changed(folder, out, {name: tensors[name] * 1e25 for name in names})


def left_behind(root: Path) -> list[str]:
    """Hidden folders a run leaves beside its output (staging, retired, stage folders)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def compress(model: Path, data: Path, out: Path, *more: str) -> tuple[int, str]:
    return invoke(
        "compress", "-m", str(model), "-d", str(data), "--samples", "2", "--seq-len", "32",
        "-o", str(out), *more,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "said", "options"),
    [
        ("lm_head.weight", NAN, "1 NaN", ["--method", "gptq"]),  # kept in full precision
        ("model.embed_tokens.weight", INF, "1 +inf", ["--method", "gptq"]),
        ("model.layers.0.self_attn.v_proj.weight", -INF, "1 -inf", ["--method", "rtn"]),
        (
            "model.layers.0.self_attn.v_proj.weight",
            -INF,
            "1 -inf",
            ["--method", "magnitude", "--sparsity", "0.5"],
        ),
        (
            "model.layers.1.self_attn.q_proj.weight",
            NAN,
            "1 NaN",
            ["--method", "rtn", "--pipeline", "data_free"],
        ),
    ],
    ids=["nan-head-gptq", "inf-embed-gptq", "ninf-v-rtn", "ninf-v-magnitude", "nan-q-data-free"],
)
def test_a_non_finite_source_weight_exits_2_naming_it(
    saved_llama: tuple[Path, Path], tmp_path: Path, name: str, value: float, said: str, options
) -> None:
    folder, data = saved_llama
    model = with_value(folder, tmp_path / "model", name, value)
    code, output = compress(model, data, tmp_path / "out", *options)
    assert code == 2, output
    assert f"are not finite: {name} holds {said} among" in output, output
    assert "Restore the checkpoint from a good copy" in output
    assert not (tmp_path / "out").exists() and not left_behind(tmp_path)


def test_evaluate_refuses_a_nan_weight_and_logits_that_are_not_finite(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    nan_head = with_value(folder, tmp_path / "nan", "lm_head.weight", NAN)
    code, output = invoke("evaluate", "-m", str(nan_head), "--data", str(data))
    assert code == 2 and "lm_head.weight holds 1 NaN among 16,384 values" in output, output
    assert "perplexity" not in output

    code, output = invoke(
        "evaluate", "-m", str(overflowing(folder, tmp_path / "big")), "--data", str(data)
    )
    assert code == 1, output
    assert "the model's logits on batch 0 hold" in output, output
    assert (
        "the first module whose output is not finite is model.layers.0.mlp.down_proj (Linear)"
        in output
    )
    assert "overflows in float32: the checkpoint's values are out of range" in output
    assert "perplexity" not in output


def test_calibration_inputs_that_are_not_finite_name_the_layer_and_subgraph(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    code, output = compress(overflowing(folder, tmp_path / "big"), data, tmp_path / "out")
    assert code == 1, output
    assert "the calibration inputs of model.layers.0.mlp.down_proj (subgraph 1) hold" in output
    assert "+inf" in output and "check the calibration data" in output
    assert not (tmp_path / "out").exists() and left_behind(tmp_path) == []


def test_a_nan_made_after_calibration_exits_1_and_keeps_the_old_checkpoint(
    saved_llama: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One NaN injected into a solve's result, then into a tensor on its way into the
    checkpoint: each is named, and the checkpoint already at --out survives byte for byte."""
    import llmc_trace.checkpoint.writer as writer
    import llmc_trace.calibrate.solve as solve

    folder, data = saved_llama
    out = tmp_path / "out"
    assert compress(folder, data, out)[0] == 0
    before = digest(out)

    def nan_result(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        result = real_gptq(*args, **kwargs)
        result.quantized.weight[0, 0] = NAN
        return result

    real_gptq = solve.gptq
    with monkeypatch.context() as patch:
        patch.setattr(solve, "gptq", nan_result)
        code, output = compress(folder, data, out, "--overwrite", "--seed", "1")
    assert code == 1, output
    assert (
        "gptq made a weight holding 1 NaN among 16,384 values for model.layers.0.self_attn"
        in output
    )
    assert digest(out) == before and left_behind(tmp_path) == []

    def nan_scale(prefix, quantized, scheme):  # noqa: ANN001, ANN202
        tensors = real_tensors(prefix, quantized, scheme)
        if prefix == "model.layers.1.mlp.down_proj":
            tensors[f"{prefix}.weight_scale"][0, 0] = NAN
        return tensors

    real_tensors = writer.module_tensors
    with monkeypatch.context() as patch:
        patch.setattr(writer, "module_tensors", nan_scale)
        code, output = compress(folder, data, out, "--overwrite", "--seed", "1")
    assert code == 1, output
    assert "model.layers.1.mlp.down_proj.weight_scale holds 1 NaN among" in output
    assert "on its way into the checkpoint" in output
    assert digest(out) == before and left_behind(tmp_path) == []


@pytest.fixture
def outside_vocabulary(saved_llama: tuple[Path, Path], tmp_path: Path) -> dict[str, Path]:
    """Data whose ids the 128-row model cannot embed: a token array holding -5, and a text
    file read through a tokenizer of 8,192 tokens (the reference model's) put in the folder."""
    folder, data = saved_llama
    tokens = np.load(data)
    tokens[3, 5] = -5
    np.save(tmp_path / "negative.npy", tokens)
    texted = tmp_path / "with-tokenizer"
    shutil.copytree(folder, texted)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(REFMODEL / name, texted / name)
    text = tmp_path / "code.txt"
    text.write_text("def parse(value):\n    return sorted(value, key=len)\n" * 200)
    return {"npy": tmp_path / "negative.npy", "text": text, "folder": folder, "texted": texted}


@pytest.mark.parametrize("command", ["compress", "evaluate"])
@pytest.mark.parametrize("kind", ["npy", "text"])
def test_token_ids_outside_the_vocabulary_exit_2(
    outside_vocabulary: dict[str, Path], tmp_path: Path, command: str, kind: str
) -> None:
    model = outside_vocabulary["folder" if kind == "npy" else "texted"]
    data = outside_vocabulary[kind]
    sizes = ["--samples", "8", "--seq-len", "32"]
    if command == "compress":
        code, output = invoke(
            command, "-m", str(model), "-d", str(data), *sizes, "-o", str(tmp_path / "out")
        )
    else:
        code, output = invoke(command, "-m", str(model), "--data", str(data), *sizes)
    assert code == 2, output
    assert "holds token ids from " + ("-5 to " if kind == "npy" else "") in output, output
    assert "outside [0, 128)" in output
    assert "Make the ids with this model's own tokenizer" in output
    assert not (tmp_path / "out").exists() and not left_behind(tmp_path)


@pytest.mark.parametrize(
    ("stage", "calibration", "said"),
    [
        (
            "  - method: gptq\n    scheme: {name: W4A16, weights: {num_bits: 4.5}}\n",
            "",
            "recipe line 3, `scheme`: num_bits=4.5 is not a whole number. use 2 to 8 bits",
        ),
        (
            "  - method: sparsegpt\n    sparsity: [2, 4]\n",
            "",
            "recipe line 3, `sparsity`: sparsity [2, 4] is neither a fraction nor N:M. Use e.g.",
        ),
        (
            "  - method: gptq\n",
            "calibration: {batch_size: 0}\n",
            "recipe line 1, `batch_size`: must be an integer of at least 1, not 0.",
        ),
    ],
    ids=["num-bits", "sparsity", "batch-size"],
)
def test_a_recipe_value_of_the_wrong_kind_exits_2_naming_its_line(
    saved_llama: tuple[Path, Path], tmp_path: Path, stage: str, calibration: str, said: str
) -> None:
    folder, data = saved_llama
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"{calibration}stages:\n{stage}")
    code, output = compress(folder, data, tmp_path / "out", "-r", str(recipe))
    assert code == 2, output
    assert said in output, output
    assert not (tmp_path / "out").exists() and not left_behind(tmp_path)
