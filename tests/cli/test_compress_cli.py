"""``llmc-trace compress``: the options reach the checkpoint, bad values exit 2 before any work."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file

from llmc_trace.algorithms import W4A16_ASYM, rtn
from llmc_trace.cli.compress_cmd import compress_command
from llmc_trace.cli.main import cli
from llmc_trace.oneshot import CompressRequest, compress


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "120", "NO_COLOR": "1"})
    return result.exit_code, result.output


def test_refine_passes_reach_the_recipe_and_change_the_integers(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    common = ["compress", "-m", str(folder), "-d", str(data), "--samples", "8", "--seq-len", "64"]
    weights = {}
    for passes in ("0", "20"):
        out = tmp_path / f"out{passes}"
        code, output = invoke(*common, "-o", str(out), "--refine-passes", passes)
        assert code == 0, output
        (stage,) = yaml.safe_load((out / "recipe.yaml").read_text())["stages"]
        assert stage["refine_passes"] == int(passes)
        weights[passes] = load_file(out / "model.safetensors")
    packed = [name for name in weights["0"] if name.endswith("weight_packed")]
    assert packed and any((weights["0"][n] != weights["20"][n]).any() for n in packed)
    assert all((weights["0"][n] == weights["20"][n]).all() for n in weights["0"] if "scale" in n)


def test_negative_refine_passes_exit_2_before_loading(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    out = tmp_path / "out"
    code, output = invoke(
        "compress", "-m", str(folder), "-d", str(data), "-o", str(out), "--refine-passes", "-1"
    )
    assert code == 2 and "--refine-passes" in output
    assert not out.exists()


def test_a_calibrating_method_on_the_data_free_pipeline_exits_2_before_loading(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """It ran, found no calibration inputs, "fell back" and then said every pipeline failed."""
    folder, data = saved_llama
    out = tmp_path / "out"
    for method in ("gptq", "sparsegpt"):
        extra = ["--sparsity", "0.5"] if method == "sparsegpt" else []
        code, output = invoke(
            "compress", "-m", str(folder), "-d", str(data), "-o", str(out),
            "--pipeline", "data_free", "--method", method, *extra,
        )  # fmt: skip
        assert code == 2 and "--pipeline" in output, output
        assert f"{method} calibrates on data, and the data_free pipeline runs none" in output
    assert not out.exists()


def test_the_default_is_the_library_default(saved_llama: tuple[Path, Path]) -> None:
    folder, data = saved_llama
    option = next(p for p in compress_command().params if p.name == "refine_passes")
    assert (
        option.default
        == CompressRequest(folder, data, samples=8, seq_len=64).stages[0].solver.refine_passes
    )


def test_static_groups_reach_gptq_the_recipe_and_the_report(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """A solver option end to end: the flag, the recipe key and the report's record of the
    stage. Without act-order, ``--no-static-groups`` fits each group's scale as GPTQ's sweep
    reaches it, from weights its earlier columns' errors moved: other scales than the up-front
    ones, which are round-to-nearest's on the original weights."""
    folder, data = saved_llama
    no_act_order = W4A16_ASYM.with_weights(actorder=None)
    first = tmp_path / "up_front"
    compress(CompressRequest(folder, data, first, samples=4, seq_len=32, scheme=no_act_order))
    again = tmp_path / "in_sweep"
    code, output = invoke(
        "compress", "-m", str(folder), "-r", str(first / "recipe.yaml"), "-o", str(again),
        "--no-static-groups",
    )  # fmt: skip
    assert code == 0, output
    (stage,) = yaml.safe_load((again / "recipe.yaml").read_text())["stages"]
    assert stage["static_groups"] is False and stage["scheme"]["weights"]["actorder"] is None
    (settings,) = json.loads((again / "report.json").read_text())["settings"]["stages"]
    assert settings["solver"]["static_groups"] is False
    original = load_file(folder / "model.safetensors")
    up_front, in_sweep = (
        load_file(first / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    scales = [name for name in up_front if name.endswith("weight_scale")]
    assert scales
    for name in scales:
        weight = original[name.removesuffix("_scale")]
        expected = rtn(weight, no_act_order.weights).scale
        assert torch.equal(up_front[name], expected.to(up_front[name].dtype)), name
    assert any(not torch.equal(up_front[name], in_sweep[name]) for name in scales)
