"""Recipes: what a run writes reads back as the same run; every mistake names its key and line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from llmc_trace.algorithms import W4A16, W8A8, resolve_scheme
from llmc_trace.core.solver import SolverSettings
from llmc_trace.errors import BadInputError
from llmc_trace.oneshot import Stage
from llmc_trace.spec.recipe import Recipe, read_recipe, render_recipe
from llmc_trace.spec.settings import CalibrationSettings, CheckpointSettings, TracingSettings

RECIPE = Recipe(
    CalibrationSettings(
        "calib.npy", modality="image", samples=256, seq_len=512, batch_size=2, seed=7
    ),
    TracingSettings(("LlamaDecoderLayer",), 2, ("re:.*rotary.*", "Qwen2VLModel.get_rope_index")),
    CheckpointSettings(torch.bfloat16, 2_000_000),
    (
        Stage("sparsegpt", None, (2, 4), pipeline="sequential"),
        Stage(
            "gptq",
            W4A16.with_weights(actorder=None),
            pipeline="layer_sequential",
            solver=SolverSettings(refine_passes=3),
            ignore=("model.layers.0.self_attn.q_proj",),
        ),
    ),
)


def test_a_written_recipe_reads_back_as_the_same_run(tmp_path: Path) -> None:
    text = render_recipe(RECIPE)
    assert text == render_recipe(RECIPE)
    (tmp_path / "recipe.yaml").write_text(text)
    assert read_recipe(tmp_path / "recipe.yaml") == RECIPE
    parsed = yaml.safe_load(text)  # any YAML reader
    assert set(parsed["versions"]) == {"llmc-trace", "torch", "transformers", "compressed-tensors"}
    assert parsed["stages"][1]["scheme"]["weights"]["actorder"] is None
    assert "model.layers.0.self_attn.q_proj" in parsed["stages"][1]["scheme"]["ignore"]
    assert parsed["checkpoint"] == {"dtype": "bfloat16", "max_shard_size": 2_000_000}


def test_a_hand_written_recipe_takes_names_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "calibration: {dataset: data.jsonl, samples: 64}\n"
        "stages:\n"
        "  - method: magnitude\n"
        "    sparsity: 0.5\n"
        "  - {method: gptq, scheme: W8A8}\n"
    )
    read = read_recipe(path)
    assert read.stages == (Stage("magnitude", None, 0.5), Stage("gptq", W8A8))
    path.write_text("stages:\n  - {method: sparsegpt, sparsity: 2:4}\n")  # not base 60
    assert read_recipe(path).stages == (Stage("sparsegpt", None, (2, 4)),)
    assert read.calibration.samples == 64
    assert read.calibration.seq_len == CalibrationSettings().seq_len  # the declared default


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("stages: [{method: gptq}]\nextra: 1\n", "extra", 2),
        (
            "calibration:\n  samples: 8\n  sample_count: 8\nstages: [{method: gptq}]\n",
            "sample_count",
            3,
        ),
        ("stages:\n  - method: sparsegpt\n    sparsity: 1.5\n", "sparsity", 3),
        ("stages:\n  - method: gptq\n    propagte: false\n", "propagte", 3),
        ("stages: []\n", "stages", 1),
        ("calibration: {samples: 8}\n", "stages", 1),
        ("stages:\n  - scheme: W4A16\n", "method", 2),
        ("stages:\n  - {method: gptq, scheme: W3A7}\n", "scheme", 2),
        ("calibration:\n  samples: eight\nstages: [{method: gptq}]\n", "samples", 2),
        ("checkpoint: {dtype: int8}\nstages: [{method: gptq}]\n", "dtype", 1),
        ("stages:\n  - {method: gptq}\n  - {method: sparsegpt, sparsity: 2:4}\n", "stages", 1),
        (
            "stages:\n  - {method: sparsegpt, sparsity: 0.5}\n  - {method: magnitude, sparsity: 2:4}\n",
            "stages",
            1,
        ),
        ("stages:\n  - method: gptq\n    method: rtn\n", "method", 3),
        (
            "stages:\n  - {method: gptq, true_sequential: true, pipeline: basic}\n",
            "true_sequential",
            2,
        ),
    ],
)
def test_a_bad_recipe_names_the_key_and_its_line(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(BadInputError) as info:
        read_recipe(path)
    assert info.value.param == "recipe"
    assert f"recipe line {line}, `{key}`" in str(info.value)


def test_unreadable_or_malformed_recipes_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="cannot read"):
        read_recipe(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("stages: [{method: gptq\n")
    with pytest.raises(BadInputError, match="not valid YAML at line"):
        read_recipe(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- gptq\n")
    with pytest.raises(BadInputError, match="not a mapping"):
        read_recipe(tmp_path / "list.yaml")


@pytest.mark.parametrize("preset", ["FP8_BLOCK", "NVFP4A16", "W4AFP8"])
def test_a_float_or_activation_preset_reads_back_from_its_written_recipe(
    preset: str, tmp_path: Path
) -> None:
    """Block structures, scale dtypes and activation arguments survive the written recipe."""
    recipe = dataclasses.replace(RECIPE, stages=(Stage("gptq", preset),))
    (tmp_path / "recipe.yaml").write_text(render_recipe(recipe))
    read = read_recipe(tmp_path / "recipe.yaml")
    assert read == recipe and read.stages[0].scheme == resolve_scheme(preset)


def test_a_negative_seed_is_refused_naming_its_line(tmp_path: Path) -> None:
    """numpy's shuffle refused it with a traceback once the run had started."""
    path = tmp_path / "r.yaml"
    path.write_text("calibration: {seed: -3}\nstages: [{method: gptq}]\n")
    with pytest.raises(BadInputError) as info:
        read_recipe(path)
    assert info.value.message == "recipe line 1, `seed`: must be an integer of at least 0, not -3."


def test_binary_recipes_are_bad_input_naming_the_file(tmp_path: Path) -> None:
    """Not UTF-8, or a character YAML refuses: a UnicodeDecodeError or ReaderError before."""
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(BadInputError) as info:
        read_recipe(binary)
    assert info.value.message == f"the recipe {binary} is not UTF-8 text (byte 128 is 0x80)."
    assert info.value.param == "recipe"
    control = tmp_path / "control.yaml"
    control.write_text("stages: [{method: gptq}]\n\x01\n")
    with pytest.raises(BadInputError) as info:
        read_recipe(control)
    assert info.value.message == (
        f"the recipe {control} is not valid YAML at line 2: it holds U+0001, a character YAML "
        "does not allow."
    )
