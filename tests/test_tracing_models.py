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
from llmc_trace.diagnose.failure import failure_from_exception
from llmc_trace.diagnose.fixes import candidate_fixes
from llmc_trace.errors import BadInputError
from llmc_trace.graph.partition import partition_trace
from llmc_trace.graph.verify import verify_subgraphs
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
    with pytest.raises(Exception) as info:
        trace_graph(original, sample([1, 2, 2]), ["Block"])
    failure = failure_from_exception(info.value)
    candidates = candidate_fixes(failure, original)
    assert [f.kind for f in candidates] == ["autowrap", "definition"]
    assert candidates[0].refusal  # the early return cannot be autowrapped
    fix = candidates[-1]
    assert fix.ignore == ("tracing_models:EarlyReturn",)

    trace = trace_graph(original, sample([1, 2, 2]), ["Block"], ignore=list(fix.ignore))
    assert trace.definitions == ["<root>"]
    assert type(original) is patterns.EarlyReturn  # its own class back after the trace
    subgraphs = partition_trace(trace).subgraphs
    for grid in ([1, 2, 2], [0, 0, 0]):  # layers used, and skipped, by the original
        verification = verify_subgraphs(original, subgraphs, sample(grid), trace.input_names)
        assert verification.ok, verification.problems
        assert verification.max_abs_diff == 0.0


def test_an_entry_without_a_registered_definition_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="No definition in tracing_models/"):
        trace_graph(model(), sample([1, 2, 2]), ["Block"], ignore=["tracing_models:EarlyReturn"])


def test_a_definition_overrides_methods_only() -> None:
    class WithState(patterns.EarlyReturn):
        def __init__(self) -> None:
            super().__init__()

    with pytest.raises(TypeError, match="overrides methods only"):
        tracing_models.register(WithState)
    assert patterns.EarlyReturn not in tracing_models.REGISTRY
