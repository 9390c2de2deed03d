"""CI's sweep: every generative model type that verified when the shipped sweep was measured
still verifies on the installed transformers, or CI turns red naming it.

The shipped sweep (``models/builtin/coverage-all.json``, what ``coverage --all --json``
printed for the README) is the reference; each type is built, traced and replayed against
its own eager forward again here. The types are split into shards, separate test items that
``pytest -n 2`` spreads over its workers, so the sweep costs the suite its CPU time once.
"""

from __future__ import annotations

import json

import pytest

from llmc_trace.attempt.swept import SWEEP_FILE
from llmc_trace.attempt.sweep import SweepRow, cpu_seconds, sweep
from llmc_trace.attempt.sweep_report import summarize, sweep_table
from llmc_trace.models.defaults import generative_types
from llmc_trace.models.source import builtin_root

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
        if any(r["outcome"] != "transformers" for r in mine)
        and all(r["outcome"] in ("verified", "transformers") for r in mine)
    }


@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda s: f"shard{s + 1}of{SHARDS}")
def test_every_type_verified_in_the_shipped_sweep_still_verifies(shard: int) -> None:
    installed = generative_types()
    expected = sorted(verified_types(SHIPPED["rows"]) & set(installed))[shard::SHARDS]
    start = cpu_seconds()
    rows = sweep(expected, workers=1)
    spent = cpu_seconds() - start
    now = verified_types([vars(row) for row in rows])
    broken = [
        f"{row.model_type} ({row.modality}): {row.outcome}: {row.problem}"
        for row in rows
        if row.model_type in set(expected) - now and not row.verified
    ]
    assert not broken, (
        f"transformers {SHIPPED['transformers']} verified these types; the installed one "
        f"does not: {broken}"
    )
    # the time box: the whole sweep is measured at SHIPPED["cpu_s"]; a shard at several times
    # its share would push the suite past its 10 minutes
    assert spent < SHARD_CPU_S, f"shard {shard + 1} took {spent:.0f} CPU s: {expected}"


def test_the_shipped_sweep_meets_its_goal_and_the_readme_shows_it() -> None:
    """At least 95 % of the types transformers can run verified, and the README's table is the
    one generated from the shipped JSON (so neither can drift from the other)."""
    from tests.conftest import REPO

    summary = SHIPPED["summary"]
    assert summary["verified_share"] >= 0.95, summary["failed"]
    assert summary["verified"] == len(verified_types(SHIPPED["rows"]))
    assert sweep_table(SHIPPED) in (REPO / "README.md").read_text()


def test_summary_counts_only_what_transformers_can_run() -> None:
    """A type whose every row is transformers' own failure is listed apart, not counted; a type
    verifies only when each of its counted modalities does."""

    def row(model_type: str, modality: str, outcome: str) -> SweepRow:
        return SweepRow(model_type, "Cls", modality, outcome, "", "", 0, 0.0)

    rows = [
        row("a", "text", "verified"),
        row("a", "image", "transformers"),  # counted type: its text verified
        row("b", "-", "transformers"),  # apart
        row("c", "text", "verified"),
        row("c", "image", "not_traceable"),  # one counted modality failed: not verified
    ]
    summary = summarize(rows)
    assert summary["transformers_cannot_run"] == ["b"]
    assert (summary["counted"], summary["verified"], summary["failed"]) == (2, 1, ["c"])
    assert verified_types([vars(r) for r in rows]) == {"a"}


def test_attempt_offers_the_fix_the_sweep_verified_for_the_model_type(monkeypatch) -> None:
    """A real checkpoint of a swept type gets the sweep's fix as its first and only retry,
    proved on the model itself, instead of the search."""
    import torch
    from transformers import PretrainedConfig

    from llmc_trace.attempt import run
    from llmc_trace.traced.model import trace_model
    from llmc_trace.traced.twin import verify_on_sample
    from llmc_trace.tracing.options import TracingOptions
    from tests.patterns import untraceable as patterns

    model = patterns.Wrapper(patterns.ValueBranch()).eval()
    model.config = PretrainedConfig()
    model.config.model_type = "toy"
    offered = {("toy", "text"): ["ValueBranch.prepare"]}
    monkeypatch.setattr(run, "swept_fix", lambda t, m: offered.get((t, m), []))
    sample = {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 3]])}
    options = TracingOptions(sequential_targets=("Block",))
    traced = trace_model(model, sample, options, name="toy")
    assert traced.failure is not None
    settled = run.settle(traced, verify_on_sample, fix=True)
    assert settled.attempt.ok
    assert [t.ignore for t in settled.tried] == [["ValueBranch.prepare"]]
    assert "coverage --all" in settled.tried[0].description


def test_coverage_all_json_and_the_table_generated_from_it(tmp_path) -> None:
    """`coverage --all --json` is one document; `--table` turns it into the README's rows."""
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
    assert "| llama | LlamaForCausalLM | text |  |  |" in table.output
    bad = runner.invoke(cli, ["coverage", "--all", "-m", "no_such_type"])
    assert bad.exit_code == 2 and "no_such_type" in bad.output
