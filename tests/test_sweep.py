"""CI's sweep: every (model type, modality) that verified when the shipped sweep was measured
still verifies on the installed transformers, or CI turns red naming it.

The shipped sweep (``models/builtin/coverage-all.json``, what ``coverage --all --json``
printed for the docs) is the reference; each verified row is built from the config it names
(the type's defaults, or the built-in its defaults needed), traced and replayed against its own
eager forward again here, and nothing else is: what did not verify costs CI no time, and
neither does a (type, modality) that ``tests/test_builtins.py`` verifies through a built-in of
that type and class (at full size on ``meta`` and on its twin: more than a sweep row proves).
The types are split into shards, separate test items that ``pytest -n 2`` spreads over its
workers, so the sweep costs the suite its CPU time once.
"""

from __future__ import annotations

import functools
import json

import pytest
import transformers

from llmc_trace.diagnose.swept import SWEEP_FILE
from llmc_trace.attempt.sweep import SweepRow, cpu_seconds
from llmc_trace.attempt.sweep_report import summarize, sweep_table
from llmc_trace.attempt.standalone import not_standalone
from llmc_trace.core.versions import release
from llmc_trace.attempt.sweep_type import DEFAULT, NOT_COUNTED, NOT_STANDALONE, resweep
from llmc_trace.models.defaults import default_config, generative_types
from llmc_trace.models.build import model_class
from llmc_trace.models.source import builtin_root, resolve_model

SHIPPED = json.loads((builtin_root() / SWEEP_FILE).read_text())
SHARDS = 4
#: CPU seconds a shard may take: three times its share of the shipped sweep's.
SHARD_CPU_S = 3 * SHIPPED["cpu_s"] / SHARDS


def verified_types(rows: list[dict[str, object]]) -> set[str]:
    """Types whose every counted row verified, as the sweep's summary counts them."""
    by_type: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        by_type.setdefault(str(row["model_type"]), []).append(row)
    return {
        model_type
        for model_type, mine in by_type.items()
        if any(r["outcome"] not in NOT_COUNTED for r in mine)
        and all(r["outcome"] in ("verified", *NOT_COUNTED) for r in mine)
    }


def verified_pairs(rows: list[dict[str, object]]) -> dict[tuple[str, str], list[str]]:
    """(model type, config) -> the modalities that verified from that config."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row["outcome"] == "verified":
            pairs.setdefault((str(row["model_type"]), str(row["config"])), []).append(
                str(row["modality"])
            )
    return pairs


@functools.cache
def verified_by_builtins() -> set[tuple[str, str, str]]:
    """(model type, class, modality) of every pair ``tests/test_builtins.py`` must verify."""
    from tests.test_builtins import EXPECTED_FAILURES, cases

    modalities: dict[str, list[str]] = {}
    for name, modality in cases():
        if (name, modality) not in EXPECTED_FAILURES:
            modalities.setdefault(name, []).append(modality)
    found = set()
    for name, verified in modalities.items():
        config = resolve_model(name).config()
        kind = (config.model_type, model_class(config, name).__name__)
        found.update((*kind, modality) for modality in verified)
    return found


def left_to_sweep(installed: dict[str, str]) -> dict[tuple[str, str], list[str]]:
    """The shipped sweep's verified (type, config) pairs, with the modalities no built-in test
    verifies (those of a type transformers no longer has are left out)."""
    covered = verified_by_builtins()
    pairs = {}
    for (model_type, config), modalities in verified_pairs(SHIPPED["rows"]).items():
        if model_type in installed:
            cls = installed[model_type]
            left = [m for m in modalities if (model_type, cls, m) not in covered]
            if left:
                pairs[(model_type, config)] = left
    return pairs


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")  # as in the sweep's workers
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda s: f"shard{s + 1}of{SHARDS}")
def test_every_pair_verified_in_the_shipped_sweep_still_verifies(shard: int) -> None:
    installed = generative_types()
    pairs = left_to_sweep(installed)
    types = sorted({t for t, _ in pairs})[shard::SHARDS]
    start = cpu_seconds()
    rows = [
        row
        for (model_type, config), modalities in sorted(pairs.items())
        if model_type in types
        for row in resweep(model_type, installed[model_type], config, modalities)
    ]
    spent = cpu_seconds() - start
    # on another release, a config that release itself cannot build or run is its own verdict
    # (5.17 builds no encoder-decoder's default config); on the shipped one, nothing is excused
    excused = ("transformers",) if transformers.__version__ != SHIPPED["transformers"] else ()
    broken = [
        f"{row.model_type} ({row.modality}, {row.config}): {row.outcome}: {row.problem}"
        for row in rows
        if not row.verified and row.outcome not in excused
    ]
    assert len(rows) == sum(len(m) for (t, _), m in pairs.items() if t in types), rows
    assert not broken, (
        f"transformers {SHIPPED['transformers']} verified these types; the installed one "
        f"does not: {broken}"
    )
    # the time box: the whole sweep is measured at SHIPPED["cpu_s"]; a shard at several times
    # its share would push the suite past its 10 minutes
    assert spent < SHARD_CPU_S, f"shard {shard + 1} took {spent:.0f} CPU s: {types}"


def test_the_shipped_sweep_meets_its_goal_and_the_docs_show_it() -> None:
    """At least 95 % of the types transformers can run verified, and the supported
    architectures page's table is the one generated from the shipped JSON (so neither can drift
    from the other)."""
    from tests.conftest import REPO

    summary = SHIPPED["summary"]
    assert summary["verified_share"] >= 0.95, summary["failed"]
    assert summary["verified"] == len(verified_types(SHIPPED["rows"]))
    assert sweep_table(SHIPPED) in (REPO / "guides" / "architectures.md").read_text()


def test_summary_counts_only_what_transformers_can_run() -> None:
    """A type whose every row is transformers' own failure is listed apart, not counted; a type
    verifies only when each of its counted modalities does."""

    def row(model_type: str, modality: str, outcome: str) -> SweepRow:
        return SweepRow(model_type, "Cls", DEFAULT, modality, outcome, "", "", 0, 0.0)

    rows = [
        row("a", "text", "verified"),
        row("a", "image", "transformers"),  # counted type: its text verified
        row("b", "-", "transformers"),  # apart
        row("c", "text", "verified"),
        row("c", "image", "not_traceable"),  # one counted modality failed: not verified
        row("d", "-", NOT_STANDALONE),  # apart again: no forward of its own
    ]
    summary = summarize(rows)
    assert summary["transformers_cannot_run"] == ["b"]
    assert summary["not_standalone"] == ["d"]
    assert (summary["counted"], summary["verified"], summary["failed"]) == (2, 1, ["c"])
    assert verified_types([vars(r) for r in rows]) == {"a"}


def test_attempt_offers_the_fix_the_sweep_verified_for_the_model_type(monkeypatch) -> None:
    """A real checkpoint of a swept type gets the sweep's fix as its first and only retry,
    proved on the model itself, instead of the search."""
    import torch
    from transformers import PretrainedConfig

    from llmc_trace.traced import settle
    from llmc_trace.traced.model import trace_model
    from llmc_trace.traced.twin import verify_on_sample
    from llmc_trace.tracing.options import TracingOptions
    from tests.patterns import untraceable as patterns

    model = patterns.Wrapper(patterns.ValueBranch()).eval()
    model.config = PretrainedConfig()
    model.config.model_type = "toy"
    offered = {("toy", "text"): ["ValueBranch.prepare"]}
    monkeypatch.setattr(settle, "swept_fix", lambda t, m: offered.get((t, m), []))
    sample = {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 3]])}
    options = TracingOptions(sequential_targets=("Block",))
    traced = trace_model(model, sample, options, name="toy")
    assert traced.failure is not None
    settled = settle.settle(traced, verify_on_sample, fix=True)
    assert settled.attempt.ok
    assert [t.tracing_ignore for t in settled.tried] == [["ValueBranch.prepare"]]
    assert "coverage --all" in settled.tried[0].description


def test_a_swept_autowrap_named_inside_its_statement_is_named_by_the_statement(
    monkeypatch,
) -> None:
    """A sweep made on another transformers release may name a line inside the statement it
    moves (a continuation line of a call written over several): the seed installs the same
    rewrite, and names it as the rewrite does, by the statement's first line, so the working
    configuration a user pastes is the one the report shows."""
    import inspect
    import types

    from llmc_trace.models.build import build_meta_model
    from llmc_trace.traced import settle
    from llmc_trace.tracing.autowrap import autowrap_entry, preview_rewrite
    from llmc_trace.tracing.rewrite import RewriteRefused

    model = build_meta_model(resolve_model("Qwen/Qwen2-Audio-7B-Instruct"))
    function = "Qwen2AudioModel.forward"
    lines, first = inspect.getsourcelines(type(model.model).forward)

    def statement_line(line: int) -> int | None:
        try:
            return preview_rewrite(model, function, line).line
        except RewriteRefused:
            return None

    inside, start = next(
        (line, statement_line(line))
        for line in range(first, first + len(lines))
        if statement_line(line) not in (None, line)
    )
    monkeypatch.setattr(settle, "swept_fix", lambda t, m: [autowrap_entry(function, inside)])
    traced = types.SimpleNamespace(model=model, sample={"input_features": None})
    [seed] = settle._swept_seeds(traced)
    assert seed.tracing_ignore == (autowrap_entry(function, start),)
    assert [rewrite.entry for rewrite in seed.rewrites] == list(seed.tracing_ignore)
    assert f"line {start} of" in seed.description


def test_classes_with_no_forward_of_their_own_are_read_off_the_class() -> None:
    """A generate-only wrapper (forward left as nn.Module's) and a draft model reading its main
    model's key/value states are told apart from a class with a forward, with why; the sweep
    builds nothing for them."""
    from llmc_trace.attempt.sweep_type import sweep_type

    wrapper = not_standalone(transformers.Qwen2_5OmniForConditionalGeneration)
    draft = not_standalone(transformers.Gemma4AssistantForCausalLM)
    assert wrapper is not None and "only generates" in wrapper
    assert draft is not None and "shared_kv_states" in draft
    assert not_standalone(transformers.Qwen2_5OmniThinkerForConditionalGeneration) is None
    assert not_standalone(transformers.LlamaForCausalLM) is None
    [only] = sweep_type("qwen2_5_omni", "Qwen2_5OmniForConditionalGeneration")
    assert (only.outcome, only.modality, only.problem) == (NOT_STANDALONE, "-", wrapper)


def test_coverage_all_json_and_the_table_generated_from_it(tmp_path) -> None:
    """`coverage --all --json` is one document; `--table` turns it into the docs' rows."""
    from click.testing import CliRunner

    from llmc_trace.cli.main import cli

    runner = CliRunner()
    result = runner.invoke(
        cli, ["--quiet", "coverage", "--all", "-m", "llama", "--workers", "1", "--json"]
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(r["model_type"], r["outcome"]) for r in document["rows"]] == [("llama", "verified")]
    saved = tmp_path / "sweep.json"
    saved.write_text(result.stdout)
    table = runner.invoke(cli, ["coverage", "--table", str(saved)])
    assert table.exit_code == 0
    assert "| llama | LlamaForCausalLM | default | text |  |  |" in table.output
    bad = runner.invoke(cli, ["coverage", "--all", "-m", "no_such_type"])
    assert bad.exit_code == 2 and "no_such_type" in bad.output


def test_a_modality_the_default_did_not_run_is_taken_from_a_built_in_that_runs_it() -> None:
    """What the default config ran stays; what it did not run (transformers' failure, or no
    sample) is replaced by the built-in's row for the modality where that one ran; a default
    that did not build at all gives way to every row of a built-in that ran anything."""
    from llmc_trace.attempt.sweep_type import _ran_instead

    def row(config: str, modality: str, outcome: str) -> SweepRow:
        return SweepRow("t", "Cls", config, modality, outcome, "", "", 0, 0.0)

    default = [row(DEFAULT, "text", "verified"), row(DEFAULT, "image", "transformers")]
    default += [row(DEFAULT, "video", "sample")]
    builtin = [row("org/b", "text", "mismatch"), row("org/b", "image", "verified")]
    builtin += [row("org/b", "video", "transformers")]
    assert _ran_instead(default, builtin) == [default[0], builtin[1], default[2]]
    unbuilt = [row(DEFAULT, "-", "transformers")]
    assert _ran_instead(unbuilt, builtin) == builtin
    assert _ran_instead(unbuilt, [row("org/b", "-", "transformers")]) == unbuilt


@pytest.mark.usefixtures("one_thread")
def test_idefics3_takes_images_from_smolvlm_where_its_default_cannot() -> None:
    """Idefics3's default tower cuts 224 pixels into 7 x 7 patches, which its pixel shuffle by
    2 cannot split, at full size as in the twin: transformers' own default. SmolVLM's
    published config runs, so its images are swept from that; the default's text stays."""
    from llmc_trace.attempt.sweep_type import _full_size_failure, sweep_type

    class_name = generative_types()["idefics3"]
    cls = getattr(transformers, class_name)
    failure = _full_size_failure(cls, default_config("idefics3"), "image")
    # before 5.20 the default's padding token lies outside its vocabulary: it fails sooner
    reason = (
        "is invalid for input of size"
        if release(transformers.__version__) >= (5, 20)
        else ("Padding_idx must be within num_embeddings")
    )
    assert failure is not None and reason in str(failure)
    rows = {(r.modality, r.config, r.outcome) for r in sweep_type("idefics3", class_name)}
    assert rows == {
        ("text", DEFAULT, "verified"),
        ("image", "HuggingFaceTB/SmolVLM-Instruct", "verified"),
    }


def test_glm4v_default_rope_sections_fail_at_full_size_not_only_in_the_twin() -> None:
    """GLM-4.1V's rope sections [8, 12, 12] cover half its 128-wide heads
    (``partial_rotary_factor`` 0.5 in the published config); the default text config leaves the
    factor out, so the full-size model fails as the twin does: not a shrink of ours."""
    from llmc_trace.attempt.sweep_type import _full_size_failure

    failure = _full_size_failure(
        transformers.Glm4vForConditionalGeneration, default_config("glm4v"), "text"
    )
    assert failure is not None and "split_sizes=[8, 12, 12]" in str(failure)
