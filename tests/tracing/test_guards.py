"""Guards: a batch that breaks a decision of the trace is detected on shapes alone."""

from __future__ import annotations

import torch

from llmc_trace.graph.partition import partition_trace
from llmc_trace.graph.verify import replay
from llmc_trace.tracing.guards import check_guards
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.conftest import tiny_llama, token_batch
from tests.patterns.untraceable import ShapeBranch, Wrapper


def batch(seq: int) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(1, seq, 8, generator=torch.Generator().manual_seed(seq)),
        "grid": torch.tensor([[1, 2, 2]]),
    }


def test_violated_guard_is_detected_on_shapes_alone() -> None:
    model = Wrapper(ShapeBranch()).eval()
    trace = trace_graph(model, batch(6), TracingOptions(sequential_targets=("Block",)))
    assert check_guards(trace.graph, model, trace.guards, batch(9)) == []
    [violation] = check_guards(trace.graph, model, trace.guards, batch(3))
    assert violation.guard.expected is True and violation.actual is False


def test_replay_is_exact_wherever_the_guards_hold() -> None:
    """A batch the guards accept replays exactly on the one trace; one they refuse would not."""
    model = Wrapper(ShapeBranch()).eval()
    trace = trace_graph(model, batch(6), TracingOptions(sequential_targets=("Block",)))
    subgraphs = partition_trace(trace).subgraphs
    for seq in (6, 9, 3, 2):
        inputs = batch(seq)
        violations = check_guards(trace.graph, model, trace.guards, inputs)
        with torch.no_grad():
            replayed, eager = replay(model, subgraphs, inputs), model(**inputs)
        assert (not violations) == (seq > 4)
        if not violations:
            torch.testing.assert_close(replayed, eager)
        else:  # the branch the trace took is wrong for this batch
            assert not torch.allclose(replayed, eager)


def test_llama_trace_is_shape_generic() -> None:
    """Shapes stay symbolic: one trace serves other sequence lengths and batch sizes."""
    model = tiny_llama()
    trace = trace_graph(model, token_batch(2, 16), TracingOptions())
    subgraphs = partition_trace(trace).subgraphs
    for batch_size, seq in ((2, 16), (1, 7), (3, 33)):
        inputs = token_batch(batch_size, seq)
        assert check_guards(trace.graph, model, trace.guards, inputs) == []
        with torch.no_grad():
            got = replay(model, subgraphs, inputs).logits
            torch.testing.assert_close(
                got, model(**inputs, use_cache=False).logits, rtol=0, atol=1e-5
            )
