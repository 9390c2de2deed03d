"""``tracing_models/``: a registered traceable definition is the fix of last resort.

``EarlyReturn`` returns early on a data-dependent condition, which neither the opaque fix nor
autowrap can express; a definition written as a small diff against it computes the same
output without the branch. The tests prove replay on the same weights equals the *original*
model's eager forward, on batches taking either path.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import tracing_models
from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.diagnose.fixes import candidate_fixes
from llmc_trace.errors import BadInputError
from llmc_trace.graph.partition import partition_trace
from llmc_trace.graph.verify import verify_subgraphs
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.patterns import untraceable as patterns


class TraceableEarlyReturn(patterns.EarlyReturn):
    """Run the layers always and choose the output with ``torch.where``: same values."""

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        skipped = x
        for layer in self.layers:
            x = layer(x)
        return torch.where(grid.sum() == 0, skipped, x)


@pytest.fixture
def registered() -> Iterator[type]:
    tracing_models.register(TraceableEarlyReturn)
    try:
        yield TraceableEarlyReturn
    finally:
        tracing_models.unregister(TraceableEarlyReturn)


def sample(grid: list[int]) -> dict[str, torch.Tensor]:
    x = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(0))
    return {"x": x, "grid": torch.tensor([grid])}


def model() -> patterns.EarlyReturn:
    torch.manual_seed(0)
    return patterns.EarlyReturn().eval()


def test_definition_is_the_last_candidate_and_replays_like_the_original(registered: type) -> None:
    original = model()
    failure = patterns.failure_of(original, sample([1, 2, 2]), ["Block"])
    candidates = candidate_fixes(failure, original)
    assert [f.kind for f in candidates] == ["autowrap", "definition"]
    assert candidates[0].refusal  # the early return cannot be autowrapped
    fix = candidates[-1]
    assert fix.tracing_ignore == ("tracing_models:EarlyReturn",)

    trace = trace_graph(
        original, sample([1, 2, 2]), TracingOptions.parse(original, fix.tracing_ignore, ["Block"])
    )
    assert trace.definitions == ["<root>"]
    assert type(original) is patterns.EarlyReturn  # its own class back after the trace
    subgraphs = partition_trace(trace).subgraphs
    for grid in ([1, 2, 2], [0, 0, 0]):  # layers used, and skipped, by the original
        verification = verify_subgraphs(original, subgraphs, sample(grid), trace.input_names)
        assert verification.ok, verification.problems
        assert verification.max_abs_diff == 0.0


def test_an_entry_without_a_registered_definition_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="No definition in tracing_models/"):
        options = TracingOptions(
            sequential_targets=("Block",), definitions=("tracing_models:EarlyReturn",)
        )
        trace_graph(model(), sample([1, 2, 2]), options)


def test_a_definition_overrides_methods_only() -> None:
    class WithState(patterns.EarlyReturn):
        def __init__(self) -> None:
            super().__init__()

    with pytest.raises(TypeError, match="overrides methods only"):
        tracing_models.register(WithState)
    assert patterns.EarlyReturn not in tracing_models.REGISTRY


# ---------------------------------------------------------------- RWKV (shipped definition)
def rwkv_twin() -> torch.nn.Module:
    from llmc_trace.models.build import build_twin
    from llmc_trace.models.source import resolve_model

    return build_twin(resolve_model("RWKV/rwkv-4-169m-pile"), seed=0).eval()


def test_rwkv_without_its_definition_fails_where_it_writes_its_weights() -> None:
    from llmc_trace.models.samples import SampleOptions, make_sample

    model = rwkv_twin()
    sample = make_sample(model.config, "text", SampleOptions())
    failure = patterns.failure_of(model, sample, ["RwkvBlock"])
    assert failure.kind == "weight_mutation"
    assert failure.location is not None and failure.location.file.endswith("modeling_rwkv.py")
    assert failure.location.function == "RwkvModel._rescale_layers"
    assert failure.origin == ["rwkv.blocks.0.attention.output.weight", "div_"]


def test_rwkv_definition_rescales_once_and_replays_like_the_original() -> None:
    """Replay (twice: the weights must be divided once, not per batch) equals the original
    eager forward, and leaves the weights exactly as the original's first call does."""
    import copy

    from llmc_trace.graph.verify import replay
    from llmc_trace.models.samples import SampleOptions, make_sample

    model = rwkv_twin()
    assert model.config.rescale_every == 2 and model.config.num_hidden_layers == 4
    original = copy.deepcopy(model)
    sample = make_sample(model.config, "text", SampleOptions())
    with torch.no_grad():
        expected = original(**sample).logits  # rescales `original` in place, once
    options = TracingOptions(
        sequential_targets=("RwkvBlock",), definitions=("tracing_models:RwkvModel",)
    )
    trace = trace_graph(model, sample, options)
    assert not any(str(n.target).endswith("_") for n in trace.graph.nodes if n.op == "call_method")
    subgraphs = partition_trace(trace).subgraphs
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(
                replay(model, subgraphs, sample).logits, expected, rtol=0, atol=0
            )
    for (name, got), (_, want) in zip(
        model.state_dict().items(), original.state_dict().items(), strict=True
    ):
        assert torch.equal(got, want), name
    stored = rwkv_twin().rwkv.blocks[3].attention.output.weight
    torch.testing.assert_close(model.rwkv.blocks[3].attention.output.weight, stored / 2)


def test_compress_refuses_a_model_whose_definition_changes_its_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Before loading anything: the checkpoint would hold RWKV's rescaled weights."""
    import numpy as np

    from llmc_trace.oneshot import CompressRequest, compress
    from llmc_trace.tracing.definitions import weight_changing

    assert weight_changing(["tracing_models:RwkvModel", "autowrap:f@1"]) == ["RwkvModel"]
    assert weight_changing(["tracing_models:EarlyReturn", "rotary_emb"]) == []
    folder = tmp_path / "rwkv"
    rwkv_twin().save_pretrained(folder)
    np.save(tmp_path / "calib.npy", np.zeros((4, 16), dtype=np.int32))
    with pytest.raises(BadInputError, match="changes the model's weights in place") as info:
        compress(
            CompressRequest(
                str(folder), dataset=tmp_path / "calib.npy", scheme="W8A16", samples=4, seq_len=16
            )
        )
    assert info.value.param == "model"


def test_a_weight_write_is_never_fixed_by_recording_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An opaque call or an autowrapped statement would repeat the write per batch. The fix
    the shipped sweep verified for RWKV (its definition) is tried first and verifies; without
    it, as for a type the sweep has no fix for, the search refuses both before the definition."""
    import llmc_trace.attempt.prove as prove
    import llmc_trace.traced.settle as settle

    def tried(report: TraceReport) -> list[tuple[str, str]]:
        return [(fix.description.split()[0], fix.outcome) for fix in report.fixes]

    seeded = prove.attempt_trace("RWKV/rwkv-4-169m-pile", fix=True)
    assert tried(seeded) == [("trace", "verified")]  # "trace RwkvModel by its definition ..."
    assert "(verified for rwkv by `coverage --all`" in seeded.fixes[0].description
    monkeypatch.setattr(settle, "swept_fix", lambda *args: [])
    report = prove.attempt_trace("RWKV/rwkv-4-169m-pile", fix=True)
    assert tried(report) == [("record", "refused"), ("autowrap", "refused"), ("trace", "verified")]
    for settled in (seeded, report):
        assert settled.applied_fix is not None
        assert settled.applied_fix.tracing_ignore == ["tracing_models:RwkvModel"]
