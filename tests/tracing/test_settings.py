"""``TracingSettings``: the one form of tracing options, and the old spellings it replaced,
accepted for one release with a ``DeprecationWarning``, which must trace exactly as the new
form does."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmc_trace.attempt.prove import attempt_trace
from llmc_trace.cli.main import cli
from llmc_trace.diagnose.fixes import Fix
from llmc_trace.diagnose.search import FixAttempt
from llmc_trace.render import render
from llmc_trace.traced.model import trace_source
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.settings import TracingSettings, tracing_settings
from tests.conftest import tiny_llama
from tests.render.helpers import llama_config

#: a module class of the tiny Llama, kept as a leaf: the trace shows it either way
NORM = "re:model\\.norm"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama")
    llama_config(2).save_pretrained(folder)
    return folder


def test_trace_source_old_keywords_warn_and_trace_as_the_settings_do(llama_dir: Path) -> None:
    settings = TracingSettings(tracing_ignore=(NORM,), targets_per_subgraph=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new form warns about nothing
        new = trace_source(str(llama_dir), tracing=settings)
    with pytest.deprecated_call(match=r"trace_source\(ignore=, targets_per_subgraph=\)"):
        old = trace_source(str(llama_dir), ignore=[NORM], targets_per_subgraph=2)
    assert old.options == new.options
    assert new.options.tracing_ignore() == [NORM] and new.options.targets_per_subgraph == 2
    assert len(new.subgraphs) == len(old.subgraphs) == 2  # 2 layers in one subgraph, + the head


def test_attempt_trace_and_render_take_the_old_ignore_with_a_warning(
    llama_dir: Path, tmp_path: Path
) -> None:
    with pytest.deprecated_call(match="tracing_ignore"):
        report = attempt_trace(str(llama_dir), ignore=[NORM], verify=False, decisions=False)
    assert report.tracing_ignore == [NORM]
    assert report.to_json()["ignore"] == [NORM]  # attempt --json keeps its key
    with pytest.deprecated_call(match="TraceReport.tracing_ignore"):
        assert report.ignore == [NORM]
    with pytest.deprecated_call(match="tracing_ignore"):
        render(str(llama_dir), tmp_path / "old.svg", view="modules", ignore=[NORM])
    render(
        str(llama_dir),
        tmp_path / "new.svg",
        view="modules",
        tracing=TracingSettings(tracing_ignore=(NORM,)),
    )
    assert (tmp_path / "old.svg").read_bytes() == (tmp_path / "new.svg").read_bytes()


def test_the_settings_and_an_old_keyword_at_once_are_refused() -> None:
    with pytest.raises(TypeError, match="tracing= and ignore="):
        tracing_settings(TracingSettings(), "attempt_trace", {"ignore": ["x"]})


def test_renamed_methods_and_fields_still_answer_with_a_warning() -> None:
    model = tiny_llama()
    options = TracingOptions.parse(model, [NORM])
    with pytest.deprecated_call(match=r"tracing_ignore\(\)"):
        assert options.ignore_list() == options.tracing_ignore() == [NORM]
    with pytest.deprecated_call(match=r"with_tracing_ignore\(\)"):
        widened = options.with_ignore(model, ["LlamaRMSNorm"])
    assert widened == options.with_tracing_ignore(model, ["LlamaRMSNorm"])
    fix = Fix("opaque", ("f",), "record f as one call")
    with pytest.deprecated_call(match="Fix.tracing_ignore"):
        assert fix.ignore == fix.tracing_ignore == ("f",)
    tried = FixAttempt(fix.description, ["f"], "verified")
    with pytest.deprecated_call(match="FixAttempt.tracing_ignore"):
        assert tried.ignore == tried.tracing_ignore == ["f"]
    assert tried.to_json()["ignore"] == ["f"] and "tracing_ignore" not in tried.to_json()


def test_the_tracing_flags_are_the_declared_options() -> None:
    """attempt, render, plan and coverage show each TracingSettings field as a flag, with its
    declared help (one declaration, four commands)."""
    helps = {
        command: CliRunner().invoke(cli, [command, "--help"], terminal_width=400).output
        for command in ("attempt", "render", "plan", "coverage")
    }
    for output in helps.values():
        for flag in ("-t, --sequential-targets", "--targets-per-subgraph", "--tracing-ignore"):
            assert flag in output
        assert "--ignore" not in output.replace("--tracing-ignore", "")  # hidden
        assert "keep as leaves, or functions to record as opaque calls" in output
