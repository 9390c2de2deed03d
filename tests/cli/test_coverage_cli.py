"""``coverage`` takes the tracing flags ``attempt`` takes and applies them to every model it
covers; ``--all`` and ``--table``, which cover each type as it traces by default, refuse them."""

from __future__ import annotations

import json

from click.testing import CliRunner

from llmc_trace.cli.main import cli
from llmc_trace.models.source import resolve_model

MODEL = "Qwen/Qwen3-0.6B"
ONE_ROW = ["--quiet", "coverage", "-m", MODEL, "--modality", "text", "--no-fix", "--json"]


def test_the_tracing_flags_reach_every_model_covered(one_thread: None) -> None:
    layers = resolve_model(MODEL).config().num_hidden_layers
    grouped = CliRunner().invoke(
        cli, [*ONE_ROW, "--targets-per-subgraph", "4", "--tracing-ignore", "Qwen3RMSNorm"]
    )
    (row,) = json.loads(grouped.output)["rows"]
    assert row["verified"] and grouped.exit_code == 0
    assert row["subgraphs"] == -(-layers // 4) + 1  # four layers a subgraph, then the head
    typo = CliRunner().invoke(cli, [*ONE_ROW, "--tracing-ignore", "Qwen3RMSNorn"])
    (row,) = json.loads(typo.output)["rows"]
    assert not row["traced"] and typo.exit_code == 1
    assert "'Qwen3RMSNorn' in tracing_ignore matches no module class" in row["problem"]


def test_all_and_table_refuse_tracing_flags() -> None:
    for mode in (["--all", "-m", "llama"], ["--table", __file__]):
        result = CliRunner().invoke(cli, ["coverage", *mode, "--targets-per-subgraph", "2"])
        assert result.exit_code == 2
        assert "takes no tracing flags" in result.output
