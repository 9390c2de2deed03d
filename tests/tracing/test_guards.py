"""Guards: a batch that breaks a decision of the cached trace is re-traced, never misrun."""

from __future__ import annotations

import torch

from llmc_trace.graph.cache import SubgraphCache
from llmc_trace.graph.verify import replay
from llmc_trace.tracing.guards import check_guards
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
    trace = trace_graph(model, batch(6), ["Block"])
    assert check_guards(trace.graph, model, trace.guards, batch(9)) == []
    [violation] = check_guards(trace.graph, model, trace.guards, batch(3))
    assert violation.guard.expected is True and violation.actual is False


def test_cache_retraces_per_signature_and_replay_stays_exact() -> None:
    model = Wrapper(ShapeBranch()).eval()
    cache = SubgraphCache(model, ["Block"])
    for seq in (6, 9, 3, 2):
        inputs = batch(seq)
        with torch.no_grad():
            torch.testing.assert_close(
                replay(model, cache.subgraphs_for(inputs), inputs), model(**inputs)
            )
    assert len({id(e) for e in cache.entries.values()}) == 2  # seq 6 and 9 share; 3 and 2 share
    assert [len(v) for _, v in cache.retraces] == [1]


def test_llama_trace_is_shape_generic() -> None:
    """Shapes stay symbolic: one trace serves other sequence lengths and batch sizes."""
    model = tiny_llama()
    cache = SubgraphCache(model, ["LlamaDecoderLayer"])
    for batch_size, seq in ((2, 16), (1, 7), (3, 33)):
        inputs = token_batch(batch_size, seq)
        with torch.no_grad():
            got = replay(model, cache.subgraphs_for(inputs), inputs).logits
            torch.testing.assert_close(
                got, model(**inputs, use_cache=False).logits, rtol=0, atol=1e-5
            )
    assert len({id(e) for e in cache.entries.values()}) == 1 and not cache.retraces
