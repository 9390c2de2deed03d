"""The decisions a trace records: the branch each ``if``/loop/ternary of model code took, at the
line ``inspect.getsourcelines`` gives, with what decided it; changing what a decision names takes
the other branch in a new trace."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
import transformers.masking_utils as masking
from transformers import __version__ as VERSION
from transformers import Qwen3MoeConfig
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.mistral import modeling_mistral
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

from click.testing import CliRunner

from llmc_trace.cli.main import cli
from llmc_trace.models.source import resolve_model
from llmc_trace.errors import LlmcTraceError
from llmc_trace.pipelines.sequential import check_batches_fit
from llmc_trace.traced.model import trace_model, trace_source
from llmc_trace.tracing.decisions import Decision
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.settings import TracingSettings
from llmc_trace.tracing.trace import trace_graph
from llmc_trace.errors import TraceStopped
from tests.patterns.untraceable import ShapeBranch, Wrapper


def _line_of(function: object, starts_with: str) -> int:
    """The file line of the first line of ``function`` that starts with ``starts_with``,
    counted from ``inspect.getsourcelines`` (the independent reference)."""
    lines, first = inspect.getsourcelines(inspect.unwrap(function))  # type: ignore[arg-type]
    for offset, text in enumerate(lines):
        if text.strip().startswith(starts_with):
            return first + offset
    raise AssertionError(f"{starts_with!r} not in {function}")


def _at(decisions: list[Decision], function: object, starts_with: str) -> Decision:
    line = _line_of(function, starts_with)
    path = inspect.getsourcefile(inspect.unwrap(function))  # type: ignore[arg-type]
    found = [d for d in decisions if d.abs_file == path and d.line == line]
    assert found, f"no decision at {path}:{line}; recorded: {[(d.file, d.line) for d in decisions]}"
    return found[0]


def test_llama_records_the_causal_mask_construction_inside_its_opaque_call() -> None:
    traced = trace_source("meta-llama/Llama-3.1-8B-Instruct", record_decisions=True)
    assert traced.traced
    early_exit = _at(traced.decisions, masking.create_causal_mask, "if early_exit:")
    # the mask builder is one graph call: its decision on the mask data is taken per batch
    assert early_exit.owner == "create_causal_mask" and early_exit.status == "value"
    assert early_exit.taken == {"else": 1} and "every batch" in early_exit.flips
    layers = _at(traced.decisions, type(traced.model.model).forward, "for decoder_layer in")
    assert layers.status == "config" and "config.num_hidden_layers = 32" in layers.decided_by
    assert layers.taken == {"iterate": 32, "exit": 1}


def test_mistral_sliding_window_is_a_config_decision_and_flips_with_the_config(
    tmp_path: Path,
) -> None:
    traced = trace_source("mistralai/Mistral-7B-v0.1", record_decisions=True)
    window = _at(traced.decisions, modeling_mistral.MistralModel.forward, "mask_function =")
    assert (window.status, window.kind, window.taken) == ("config", "ternary", {"else": 1})
    assert window.decided_by == "config.sliding_window = 4096"
    assert "config.sliding_window is not 4096" in window.flips
    built = [n for n in traced.partitioned.trace.graph.nodes if n.op == "call_function"]
    assert any(n.target.__name__ == "create_sliding_window_causal_mask" for n in built)

    # what flips it: the same model without a window takes the other branch in a new trace
    config = dict(resolve_model("mistralai/Mistral-7B-v0.1").config().to_dict())
    config["sliding_window"] = None
    (tmp_path / "config.json").write_text(json.dumps(config))
    flipped = trace_source(str(tmp_path), record_decisions=True)
    other = _at(flipped.decisions, modeling_mistral.MistralModel.forward, "mask_function =")
    assert other.taken == {"then": 1} and other.decided_by == "config.sliding_window = None"
    rebuilt = [n for n in flipped.partitioned.trace.graph.nodes if n.op == "call_function"]
    assert any(n.target.__name__ == "create_causal_mask" for n in rebuilt)
    assert not any(n.target.__name__ == "create_sliding_window_causal_mask" for n in rebuilt)


def test_gemma3_builds_its_masks_and_loops_over_its_sliding_window_layer_types() -> None:
    traced = trace_source("google/gemma-3-4b-it", record_decisions=True)
    construction = _at(
        traced.decisions,
        modeling_gemma3.Gemma3Model.forward,
        "if not isinstance(causal_mask_mapping",
    )
    assert construction.status == "shape" and construction.taken == {"then": 1}
    layer_types = _at(
        traced.decisions, modeling_gemma3.Gemma3TextModel.forward, "for layer_type in set("
    )
    assert layer_types.status == "config" and "sliding_attention" in layer_types.decided_by
    assert layer_types.taken == {"iterate": 2, "exit": 1}  # sliding and full attention


def test_qwen2_vl_image_features_are_inserted_and_the_rope_index_stopped_the_trace() -> None:
    as_written = trace_source("Qwen/Qwen2-VL-2B-Instruct", modality="image", record_decisions=True)
    assert not as_written.traced
    stopped = [d for d in as_written.decisions if "stopped" in d.taken]
    assert len(stopped) == 1 and stopped[0].unguarded and stopped[0].status == "value"
    assert stopped[0].function == "Qwen2VLModel.get_rope_index" and stopped[0].kind == "for"
    assert as_written.failure is not None and as_written.failure.location.line == stopped[0].line

    fixed = trace_source(
        "Qwen/Qwen2-VL-2B-Instruct",
        modality="image",
        tracing=TracingSettings(tracing_ignore=("Qwen2VLModel.get_rope_index",)),
        record_decisions=True,
    )
    assert fixed.traced
    forward = modeling_qwen2_vl.Qwen2VLModel.forward
    if 'if mm_encoder_outputs.get("image") is not None' not in inspect.getsource(forward):
        pytest.skip(f"the merge statements read below are not those of transformers {VERSION}")
    images = _at(fixed.decisions, forward, 'if mm_encoder_outputs.get("image") is not None')
    assert images.status == "shape" and images.taken == {"then": 1}
    videos = _at(fixed.decisions, forward, 'if mm_encoder_outputs.get("video") is not None')
    assert videos.taken == {"else": 1} and videos.untaken
    # the data-dependent loop now belongs to the opaque call: nothing unguarded is left
    rope = [d for d in fixed.decisions if d.function == "Qwen2VLModel.get_rope_index"]
    assert rope and all(d.owner == "Qwen2VLModel.get_rope_index" for d in rope)
    assert not [d for d in fixed.decisions if d.unguarded]


def test_moe_expert_routing_loop_is_data_dependent() -> None:
    config = Qwen3MoeConfig(
        hidden_size=16, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2
    )
    experts = Qwen3MoeExperts(config)
    sample = {
        "hidden_states": torch.randn(5, 16),
        "top_k_index": torch.tensor([[0, 1], [1, 2], [0, 3], [2, 3], [0, 2]]),
        "top_k_weights": torch.full((5, 2), 0.5),
    }
    options = TracingOptions(sequential_targets=("re:^act_fn$",), record_decisions=True)
    with pytest.raises(TraceStopped) as stopped:
        trace_graph(experts, sample, options)
    forward = inspect.unwrap(Qwen3MoeExperts.forward)
    loop = _at(stopped.value.decisions, forward, "for expert_idx in expert_hit:")
    assert loop.status == "value" and loop.unguarded and loop.taken == {"stopped": 1}
    assert "depends on tensor data" in loop.decided_by


def test_recording_is_off_unless_asked() -> None:
    traced = trace_source("meta-llama/Llama-3.1-8B-Instruct")
    assert traced.traced and traced.decisions == []


def test_attempt_decisions_json_lists_each_decision_sample_dependent_first() -> None:
    result = CliRunner().invoke(
        cli,
        [
            "--quiet",
            "attempt",
            "--model",
            "mistralai/Mistral-7B-v0.1",
            "--no-verify",
            "--decisions",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    decisions = json.loads(result.stdout)["decisions"]
    assert decisions and all(
        {"status", "file", "line", "source", "decided_by", "flips"} <= set(d) for d in decisions
    )
    order = ["value", "shape", "config", "constant", "unknown"]
    ranks = [order.index(d["status"]) for d in decisions]
    assert ranks == sorted(ranks) and ranks[0] <= 1
    window = [d for d in decisions if d["source"] == "self.config.sliding_window is None"]
    assert window and window[0]["status"] == "config" and window[0]["taken"] == {"else": 1}

    shown = CliRunner().invoke(
        cli,
        [
            "--quiet",
            "attempt",
            "--model",
            "mistralai/Mistral-7B-v0.1",
            "--no-verify",
            "--decisions",
        ],
        env={"COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert shown.exit_code == 0, shown.output
    assert "decisions the trace baked in" in shown.output
    assert "config.sliding_window = 4096" in shown.output
    assert shown.output.index(" value ") < shown.output.index(" config ")


def test_a_shape_guard_is_a_shape_decision_and_calibration_names_it_when_a_batch_flips_it() -> None:
    """ShapeBranch's ``if x.shape[1] > 4`` (a sliding-window test in small): the decision holds
    the guard; a batch of 3 positions would take the other branch, and calibration refuses it
    naming the statement."""
    model = Wrapper(ShapeBranch()).eval()

    def batch(seq: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(1, seq, 8), "grid": torch.tensor([[1, 2, 2]])}

    options = TracingOptions(sequential_targets=("Block",), record_decisions=True)
    traced = trace_model(model, batch(6), options, name="shape-branch")
    branch = _at(traced.decisions, ShapeBranch.prepare, "if x.shape[1] > 4:")
    assert (branch.status, branch.taken) == ("shape", {"then": 1})
    assert branch.guards and "calibration refuses it" in branch.flips
    with pytest.raises(LlmcTraceError, match=r"batch 1 breaks .*`if x.shape\[1\] > 4:`"):
        check_batches_fit(traced, [batch(6), batch(3)])
    check_batches_fit(traced, [batch(6), batch(9)])  # the same branch: accepted
    # traced on such a batch, the other branch is taken
    shorter = trace_model(model, batch(3), options, name="shape-branch")
    assert _at(shorter.decisions, ShapeBranch.prepare, "if x.shape[1] > 4:").taken == {"else": 1}


def test_coverage_all_counts_decisions_by_kind_and_status_and_lists_the_unguarded() -> None:
    from llmc_trace.attempt.sweep_report import summarize, sweep_table
    from llmc_trace.attempt.sweep_type import DEFAULT, SweepRow

    rows = [
        SweepRow("a", "A", DEFAULT, "text", "verified", "", "", 2, 0.1, {"for config": 1}),
        SweepRow(
            "b",
            "B",
            DEFAULT,
            "image",
            "not_traceable",
            "",
            "",
            0,
            0.1,
            {"for value": 1, "if shape": 2},
            ["modeling_b.py:12"],
        ),
    ]
    summary = summarize(rows)
    assert summary["decisions"] == {"for": {"config": 1, "value": 1}, "if": {"shape": 2}}
    assert summary["unguarded"] == [
        {"model_type": "b", "modality": "image", "where": "modeling_b.py:12"}
    ]
    document = {
        "transformers": "x",
        "torch": "y",
        "elapsed_s": 1.0,
        "cpu_s": 1.0,
        "workers": 1,
        "summary": summary,
        "rows": [vars(r) for r in rows],
    }
    table = sweep_table(document)
    assert "| for | 1 | 0 | 1 |" in table and "- b (image): modeling_b.py:12" in table


def test_instrumented_code_runs_as_written_after_the_trace() -> None:
    """A closure made while traced keeps its instrumented code: after the trace it decides as
    the original would, and the functions themselves have their own code back."""
    import sys

    from llmc_trace.tracing.instrument import instrumented

    module = sys.modules[__name__]
    original = _make_window.__code__
    with instrumented([module], hook=_Recorded()) as files:
        assert __file__ in files and _make_window.__code__ is not original
        inside = _make_window(2)
    assert _make_window.__code__ is original
    assert [inside(d) for d in (0, 1, 3)] == [True, True, False]


class _Recorded:
    def mark(self) -> int:
        return 0

    def decide(self, site: int, mark: int, value: object) -> bool:
        return bool(value)

    def loop(self, site: int, mark: int, iterable: object) -> object:
        return iter(iterable)  # type: ignore[call-overload]


def _make_window(size: int):  # type: ignore[no-untyped-def]
    def inside(distance: int) -> bool:
        if distance < size:
            return True
        return False

    return inside


class _Gated(torch.nn.Module):
    """A name set only under an earlier ``if`` (as Qwen3-VL's ``image_mask``)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scale = None
        if mask is not None:
            scale = mask
        if scale is not None:
            x = x * scale
        return self.block(x)


@pytest.mark.parametrize("given", [True, False])
def test_a_name_set_under_an_earlier_if_is_decided_by_that_if(given: bool) -> None:
    sample = {"x": torch.randn(2, 4), **({"mask": torch.ones(2, 4)} if given else {})}
    options = TracingOptions(sequential_targets=("Linear",), record_decisions=True)
    traced = trace_model(_Gated(), sample, options, name="gated")
    first = _at(traced.decisions, _Gated.forward, "if mask is not None:")
    second = _at(traced.decisions, _Gated.forward, "if scale is not None:")
    assert first.status == second.status == "shape"
    assert second.taken == {"then" if given else "else": 1}
    if given:  # the `then` branch ran and set scale: that `if` decided
        assert f"set by the branch the `if` at line {first.line} took" in second.decided_by
        assert "the sample gives mask" in second.decided_by
    else:  # scale is None because mask is: the parameter's own absence decides the first if
        assert "the sample has no mask" in first.decided_by
