"""recipe.yaml: valid YAML saying what was done, byte-identical for the same inputs."""

from __future__ import annotations

import yaml

from llmc_trace.checkpoint import Recipe, render_recipe
from llmc_trace.compress import W4A16, W8A8


def test_recipe_is_yaml_that_states_what_was_done() -> None:
    recipe = Recipe(
        "sparsegpt",
        num_samples=256,
        seq_len=512,
        pipeline="sequential",
        seed=7,
        attn_implementation="sdpa",
        true_sequential=False,
    )
    text = render_recipe(recipe, [W4A16.with_weights(actorder=None), W8A8], (2, 4))
    assert text == render_recipe(recipe, [W4A16.with_weights(actorder=None), W8A8], (2, 4))
    parsed = yaml.safe_load(text)
    assert parsed["method"] == "sparsegpt"
    assert parsed["calibration"] == {
        "num_samples": 256,
        "seq_len": 512,
        "pipeline": "sequential",
        "seed": 7,
        "attn_implementation": "sdpa",
        "true_sequential": False,
    }
    assert parsed["sparsity"] == {"structure": "2:4", "fraction": 0.5}
    first, second = parsed["schemes"]
    assert first["name"] == "W4A16" and first["input_activations"] is None
    assert first["weights"] == {
        "num_bits": 4,
        "symmetric": True,
        "strategy": "group",
        "group_size": 128,
        "observer": "minmax",
        "actorder": None,
    }
    assert first["ignore"][0] == "lm_head" and first["targets"] == ["Linear"]
    assert second["input_activations"] == {"num_bits": 8, "symmetric": True}
    assert parsed["percdamp"] is None and parsed["refine_passes"] is None


def test_recipe_without_schemes_or_sparsity() -> None:
    parsed = yaml.safe_load(render_recipe(Recipe("magnitude"), [], None))
    assert parsed["schemes"] == [] and parsed["sparsity"] is None
    assert parsed["calibration"]["num_samples"] is None
