"""``llmc-trace attempt``: exit codes, the human view, and the JSON view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmc_trace.cli.display import fix_snippet
from llmc_trace.cli.main import cli
from llmc_trace.diagnose.failure import failure_from_exception
from llmc_trace.errors import BadInputError, TraceStopped
from llmc_trace.diagnose.fixes import autowrap_fix
from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.diagnose.search import FixAttempt
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.patterns.untraceable import ForwardBranch

LLAMA = "meta-llama/Llama-3.1-8B"
QWEN_VL = "Qwen/Qwen2-VL-2B-Instruct"


def invoke(*args: str) -> tuple[int, str, str]:
    runner = CliRunner()
    result = runner.invoke(cli, ["--quiet", *args], env={"COLUMNS": "120", "NO_COLOR": "1"})
    return result.exit_code, result.stdout, result.stderr


def test_attempt_traces_and_verifies_a_builtin() -> None:
    code, out, _ = invoke("attempt", "--model", LLAMA)
    assert code == 0, out
    assert "traced and verified" in out and "33 subgraphs" in out


def test_attempt_json_is_one_document_with_the_same_facts() -> None:
    code, out, _ = invoke("attempt", "--model", LLAMA, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True and report["num_subgraphs"] == 33
    assert report["subgraphs"][1]["targets"] == ["model.layers.0"]
    assert report["verification"]["max_abs_diff"] <= 1e-5


def test_untraceable_model_exits_1_with_location_and_json_diagnosis() -> None:
    code, out, _ = invoke("attempt", "--model", QWEN_VL, "--modality", "image")
    assert code == 1
    assert "not traceable" in out and "modeling_qwen2_vl.py" in out
    code, out, _ = invoke("attempt", "--model", QWEN_VL, "--modality", "image", "--json")
    assert code == 1
    failure = json.loads(out)["failure"]
    assert failure["location"]["file"].endswith("modeling_qwen2_vl.py")
    assert failure["location"]["function"] == "Qwen2VLModel.get_rope_index"
    assert failure["module_path"] == "model"


def test_fix_finds_a_verified_configuration() -> None:
    code, out, _ = invoke("attempt", "--model", QWEN_VL, "--modality", "image", "--fix", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["applied_fix"]["ignore"] == ["Qwen2VLModel.get_rope_index"]
    assert report["sequential_targets"][0] == "model.language_model.layers.0"


@pytest.mark.parametrize("columns", [80, 160])
def test_subgraph_table_keeps_each_row_on_one_line_at_any_width(columns: int) -> None:
    """On 80 columns the targets' shared path moves to the title instead of folding every
    target name (and a figure such as "1002.0 MiB") over two lines."""
    result = CliRunner().invoke(
        cli,
        ["--quiet", "attempt", "-m", QWEN_VL, "--modality", "image", "--fix"],
        env={"COLUMNS": str(columns), "NO_COLOR": "1"},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= columns
    start = lines.index(next(line for line in lines if line.startswith("29 subgraphs")))
    rows = [line.split("│")[1:-1] for line in lines[start:] if line.startswith("│ ")][:13]
    assert [row[0].strip() for row in rows] == [*map(str, range(6)), "…", *map(str, range(23, 29))]
    shared = "model.language_model."
    assert (shared in lines[start]) == (columns == 80)
    first_target = ("" if columns == 80 else shared) + "layers.0"
    assert rows[1][1].strip() == first_target
    assert all(cell.strip() for row in rows if row[0].strip() != "…" for cell in row[2:])


@pytest.mark.parametrize(
    ("args", "param"),
    [
        (["--model", "no-such-model"], "--model"),
        (["--model", LLAMA, "--sequential-targets", "NoSuchLayer"], "--sequential-targets"),
        (
            ["--model", LLAMA, "--sequential-targets", "re:nothing\\.matches"],
            "--sequential-targets",
        ),
        (["--model", LLAMA, "--modality", "audio"], "--modality"),
        (["--model", LLAMA, "--targets-per-subgraph", "0"], "--targets-per-subgraph"),
        (["--model", LLAMA, "--ignore", "LlamaRotaryEmbeding"], "--ignore"),
        (["--model", LLAMA, "--ignore", "re:["], "--ignore"),
        (["--model", LLAMA, "--sequential-targets", "re:("], "--sequential-targets"),
    ],
)
def test_bad_input_exits_2_naming_the_parameter(args: list[str], param: str) -> None:
    code, _, err = invoke("attempt", *args)
    assert code == 2
    assert param in err and "Traceback" not in err


def test_folder_without_config_exits_2(tmp_path: Path) -> None:
    code, _, err = invoke("attempt", "--model", str(tmp_path))
    assert code == 2 and "config.json" in err


def test_fix_snippet_shows_autowrapped_statements_before_and_after() -> None:
    model = ForwardBranch().eval()
    with pytest.raises(TraceStopped) as info:
        trace_graph(
            model,
            {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 2]])},
            TracingOptions(sequential_targets=("Block",)),
        )
    fix = autowrap_fix(failure_from_exception(info.value), model)
    assert fix is not None and fix.rewrites
    applied = FixAttempt(
        fix.description, list(fix.tracing_ignore), "verified", rewrites=list(fix.rewrites)
    )
    report = TraceReport(
        "local", "ForwardBranch", "text", [], [], 1, True, [], {}, applied_fix=applied
    )
    snippet = fix_snippet(report)
    assert f"tracing=TracingSettings(tracing_ignore=[{fix.tracing_ignore[0]!r}])" in snippet
    assert "# before:\n#   if grid.sum() > 4:\n#       x = x * 2\n# after:\n" in snippet
    assert f"#   x = {fix.rewrites[0].after.splitlines()[-1].split(' = ', 1)[1]}" in snippet


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_and_quiet_are_taken_before_or_after_the_command(where: str) -> None:
    """`llmc-trace --debug attempt ...` and `llmc-trace attempt ... --debug` alike: the bad
    input's own exception comes out, instead of the one-line error."""
    command = ["attempt", "--model", "no-such-model"]
    flags = ["--quiet", "--debug"]
    args = [*flags, *command] if where == "before" else [*command, *flags]
    result = CliRunner().invoke(cli, args, env={"NO_COLOR": "1"})
    assert isinstance(result.exception, BadInputError), result.output
    plain = CliRunner().invoke(cli, ["--quiet", *command], env={"NO_COLOR": "1"})
    assert plain.exit_code == 2 and not isinstance(plain.exception, BadInputError)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"num_attention_heads": 0}, "not a valid 'llama' config"),
        ({"hidden_size": 0}, "cannot build LlamaForCausalLM"),
        ({"vocab_size": -5}, "negative dimension -5"),
        ({"vocab_size": 0}, "vocab_size is 0"),
        ({"hidden_act": "nosuchact"}, "KeyError: 'nosuchact'"),
    ],
)
def test_a_config_value_transformers_cannot_build_is_bad_input(
    tmp_path: Path, change: dict, said: str
) -> None:
    """Values transformers accepts but cannot build a model from are the config's fault:
    exit 2 naming --model, never an unexpected error to report."""
    config = {
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "intermediate_size": 64,
        "vocab_size": 100, "max_position_embeddings": 64, **change,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = invoke("attempt", "--model", str(tmp_path), "--seq-len", "8")
    said_all = " ".join(err.split())
    assert code == 2 and "--model" in said_all and said in said_all, said_all
    assert "unexpected" not in said_all


def test_real_weights_of_a_quantized_checkpoint_are_refused(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Refused from its config, as compress refuses it, not a replay failing on a Linear
    without a weight."""
    import shutil

    folder = tmp_path / "quantized"
    shutil.copytree(saved_llama[0], folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = invoke("attempt", "--model", str(folder), "--real-weights")
    said = " ".join(err.split())
    assert code == 2 and "--real-weights" in said and "stores quantized weights" in said, said
