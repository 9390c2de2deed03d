"""``coverage`` takes the tracing flags ``attempt`` takes and applies them to every model it
covers; ``--all`` and ``--table``, which cover each type as it traces by default, refuse them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


def test_table_refuses_a_file_that_is_no_sweep_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was a JSONDecodeError, TypeError or KeyError traceback."""
    contents = ['{"rows": [', "", "[1, 2]", '{"hello": "world"}', '{"rows": [{"model": "x"}]}']
    for index, content in enumerate(contents):
        path = tmp_path / f"{index}.json"
        path.write_text(content)
        result = CliRunner().invoke(cli, ["coverage", "--table", str(path)])
        assert result.exit_code == 2, result.output
        assert (
            f"Invalid value for --table: {path} is not a `llmc-trace coverage --all --json` "
            f"document. Make one with `llmc-trace coverage --all --json > {path}`"
        ) in " ".join(result.output.split())
    monkeypatch.setattr(Path, "read_bytes", _refuse)
    result = CliRunner().invoke(cli, ["coverage", "--table", str(path)])
    assert result.exit_code == 2
    assert f"cannot read {path} (Permission denied)" in " ".join(result.output.split())


def _refuse(path: Path) -> bytes:
    raise PermissionError(13, "Permission denied")


def test_a_config_this_transformers_cannot_read_is_a_row_not_the_end(
    one_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in published for a newer transformers (Laguna's config on 5.17) was read before
    any trace, and its refusal ended the whole coverage run: it is now that model's row."""
    from llmc_trace.errors import BadInputError
    from llmc_trace.models.source import ModelSource

    read = ModelSource.config
    unreadable = "meta-llama/Llama-3.1-8B-Instruct"

    def config(self: ModelSource, read_as: str | None = None) -> object:
        if self.name == unreadable:
            raise BadInputError("transformers 5.17.0 cannot read the config of it", hint="x")
        return read(self, read_as)

    monkeypatch.setattr(ModelSource, "config", config)
    result = CliRunner().invoke(cli, [*ONE_ROW, "-m", unreadable])
    rows = {row["model"]: row for row in json.loads(result.output)["rows"]}
    assert rows[MODEL]["verified"]
    assert rows[unreadable]["modality"] == "-" and not rows[unreadable]["traced"]
    assert rows[unreadable]["problem"] == "transformers 5.17.0 cannot read the config of it"
    assert rows[unreadable]["model_type"] == "llama"
    assert result.exit_code == 1
