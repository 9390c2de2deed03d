"""``llmc-trace plan --recipe``: one plan per stage, at the recipe's sizes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmc_trace.cli.main import cli

MODEL = "meta-llama/Llama-3.1-8B"


def plan_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["--quiet", "plan", "-m", MODEL, "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_recipe_is_planned_stage_by_stage_at_its_sizes(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "calibration: {samples: 64, seq_len: 1024}\n"
        "stages:\n  - {method: magnitude, sparsity: 2:4}\n  - {method: gptq, scheme: W4A16}\n"
    )
    first, second = plan_json("--recipe", str(recipe))["stages"]
    assert (first["stage"], second["stage"]) == ("stage 1: magnitude", "stage 2: gptq")
    assert first["chosen"] == "data_free" and second["chosen"] == "sequential"
    alone = plan_json("--samples", "64", "--seq-len", "1024")
    assert second["estimates"] == alone["estimates"]  # the same plan as a one-stage run
    # only the last stage keeps resume points (an interrupted earlier stage restarts)
    assert first["resume_bytes"] is None and second["resume_bytes"] == alone["resume_bytes"] > 0
    shown = CliRunner().invoke(
        cli, ["--quiet", "plan", "-m", MODEL, "--recipe", str(recipe)], env={"COLUMNS": "200"}
    )
    assert "resume points of the last stage (stage 2; an earlier one restarts): up to" in (
        shown.output
    )
    fewer = plan_json("--recipe", str(recipe), "--samples", "8")["stages"][1]
    cache = {e["pipeline"]: e["cache_bytes"] for e in fewer["estimates"]}
    full = {e["pipeline"]: e["cache_bytes"] for e in second["estimates"]}
    assert cache["sequential"] < full["sequential"] / 4  # the flag overrides the recipe's 64


def test_ranks_plan_one_rank_of_many_and_refuse_what_they_cannot_share() -> None:
    one = plan_json("--samples", "64", "--seq-len", "1024")
    two = plan_json("--samples", "64", "--seq-len", "1024", "--ranks", "2")
    cache = [
        next(e["cache_bytes"] for e in plan["estimates"] if e["pipeline"] == "sequential")
        for plan in (one, two)
    ]
    assert cache[1] < 0.6 * cache[0]  # each rank caches half of the rows
    result = CliRunner().invoke(
        cli, ["--quiet", "plan", "-m", MODEL, "--data-free", "--ranks", "2", "--json"]
    )
    assert result.exit_code == 2 and "needs no calibration data" in result.stdout


def test_mappings_lists_every_layers_pairs_and_the_ones_left_out() -> None:
    document = plan_json("--mappings")
    pairs = {(m["smooth"], tuple(m["balance"])) for m in document["mappings"]}
    assert len(pairs) == 3 * 32  # norm -> q/k/v, norm -> gate/up, up -> down in 32 layers
    assert (
        "model.layers.31.mlp.up_proj", ("model.layers.31.mlp.down_proj",)
    ) in pairs  # fmt: skip
    reasons = {s["smooth"]: s["reason"] for s in document["skipped"]}
    assert "grouped-query attention" in reasons["model.layers.0.self_attn.v_proj"]
    assert reasons["model.norm"] == "lm_head is not quantized"


def test_every_pipeline_name_and_description_reads_whole_at_any_width() -> None:
    """Narrow, the descriptions go under the table instead of wrapping a word per line; wide,
    they are its last column. Either way each pipeline's name is whole, on one line."""
    details = {e["pipeline"]: e["detail"] for e in plan_json()["estimates"]}
    for columns in (80, 160):
        result = CliRunner().invoke(
            cli, ["--quiet", "plan", "-m", MODEL], env={"COLUMNS": str(columns), "NO_COLOR": "1"}
        )
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert max(len(line) for line in lines) <= columns
        cells = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
        assert [row[0].strip() for row in cells if row[0].strip()] == list(details)
        if columns < 120:
            assert all(len(row) == 4 for row in cells)  # one line per pipeline
            words = " ".join(result.output.split())
            assert all(f"{name}: {detail}" in words for name, detail in details.items())
        else:
            assert all(len(row) == 5 for row in cells)


def test_a_seq_len_past_the_models_positions_is_refused_by_plan_and_evaluate(
    tmp_path: Path,
) -> None:
    """As compress refuses it: positions past max_position_embeddings are untrained, and
    plan planned such a run, evaluate scored it, without a word."""
    from refmodel import FOLDER as REFMODEL

    limit = json.loads((REFMODEL / "config.json").read_text())["max_position_embeddings"]
    text = tmp_path / "long.txt"
    text.write_text("word " * (3 * limit))
    for command in (
        ["plan", "-m", MODEL, "--seq-len", "999999"],
        ["evaluate", "-m", str(REFMODEL), "-d", str(text), "--seq-len", str(limit + 1)],
    ):
        result = CliRunner().invoke(cli, ["--quiet", *command], env={"NO_COLOR": "1"})
        assert result.exit_code == 2, result.output
        assert "exceed the" in result.output and "(max_position_embeddings)" in result.output


def test_a_model_that_needs_a_fix_is_planned_with_the_fix_compress_applies() -> None:
    """compress finds Qwen2-VL's fix and calibrates sequentially; the plan left sequential out
    ("the model does not trace") and chose another pipeline than the run would."""
    vlm = ["-m", "Qwen/Qwen2-VL-2B-Instruct", "--modality", "image", "--json"]
    fixed = json.loads(CliRunner().invoke(cli, ["--quiet", "plan", *vlm]).stdout)
    assert fixed["tracing_fix"] == ["Qwen2VLModel.get_rope_index"]
    assert "sequential" in [e["pipeline"] for e in fixed["estimates"]]
    given = ["--tracing-ignore", "Qwen2VLModel.get_rope_index"]
    as_given = json.loads(CliRunner().invoke(cli, ["--quiet", "plan", *vlm, *given]).stdout)
    assert as_given["tracing_fix"] == [] and as_given["estimates"] == fixed["estimates"]
