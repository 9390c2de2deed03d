"""The reference tool's silent-corruption pitfalls, each replayed against eager."""

from __future__ import annotations

import pytest
import torch

from llmc_trace import trace_subgraphs
from llmc_trace.graph.verify import replay
from tests.conftest import tiny_llama, token_batch
from tests.patterns.stateful import cases


@pytest.mark.parametrize("name", sorted(cases()))
def test_replay_equals_eager(name: str) -> None:
    case = cases()[name]
    model = case.model.eval()
    with torch.no_grad():
        expected = model(**case.sample)
        subgraphs = trace_subgraphs(model, case.sample, case.targets)
        actual = replay(model, subgraphs, case.sample)
    assert all(len(s.targets) <= 1 for s in subgraphs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)


def test_config_is_referenced_not_rebuilt() -> None:
    """A rebuilt config loses _attn_implementation and with it the causal mask."""
    model = tiny_llama()
    model.config._attn_implementation = "eager"
    sample = token_batch()
    subgraphs = trace_subgraphs(model, sample, ["LlamaDecoderLayer"])
    head = subgraphs[0].graph
    config_reads = [n for n in head.nodes if n.op == "get_attr" and n.target == "config"]
    assert config_reads, "the mask builder must read model.config itself"
    with torch.no_grad():
        expected = model(**sample, use_cache=False).logits
        actual = replay(model, subgraphs, sample).logits
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def test_a_dtype_is_a_literal_not_a_read_of_the_module_that_stores_it() -> None:
    """Switch's router stores ``self.dtype = torch.float32``; an fp32 model's own
    ``x.dtype`` is the same singleton and must not become a read of the router."""

    class Router(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dtype = torch.float32
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x.to(self.dtype))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Router(), Router()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = (1.0 - x.to(dtype=x.dtype)) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x) + mask
            return x

    model = Model()
    sample = {"x": torch.rand(2, 4)}
    subgraphs = trace_subgraphs(model, sample, ["Router"])
    reads = [n.target for s in subgraphs for n in s.graph.nodes if n.op == "get_attr"]
    assert not any(str(target).endswith("dtype") for target in reads), reads
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, sample), model(**sample))


def test_every_target_alone_and_last_subgraph_returns_the_output() -> None:
    model = tiny_llama(layers=4)
    subgraphs = trace_subgraphs(model, token_batch(), ["LlamaDecoderLayer"])
    assert [s.targets for s in subgraphs] == [[], *[[f"model.layers.{i}"] for i in range(4)]]
    assert "output" in {n.name for n in subgraphs[-1].graph.nodes if n.op == "output"}
    with torch.no_grad():
        result = replay(model, subgraphs, token_batch())
    assert result is not None and result.logits.shape == (2, 16, 128)


@pytest.mark.parametrize("per_subgraph", [2, 3])
def test_targets_per_subgraph_groups_consecutive_targets(per_subgraph: int) -> None:
    model = tiny_llama(layers=5)
    sample = token_batch()
    subgraphs = trace_subgraphs(
        model, sample, ["LlamaDecoderLayer"], targets_per_subgraph=per_subgraph
    )
    layers = [s.targets for s in subgraphs if s.targets]
    flat = [t for group in layers for t in group]
    assert flat == [f"model.layers.{i}" for i in range(5)]
    assert all(1 <= len(group) <= per_subgraph for group in layers)
    assert len(layers) == -(-5 // per_subgraph)
    with torch.no_grad():
        torch.testing.assert_close(
            replay(model, subgraphs, sample).logits,
            model(**sample, use_cache=False).logits,
            rtol=0,
            atol=1e-5,
        )


def test_targets_per_subgraph_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        trace_subgraphs(tiny_llama(), token_batch(), ["LlamaDecoderLayer"], targets_per_subgraph=0)


def test_no_consumed_name_is_read_later() -> None:
    subgraphs = trace_subgraphs(tiny_llama(layers=4), token_batch(), ["LlamaDecoderLayer"])
    for i, subgraph in enumerate(subgraphs):
        later_inputs = {name for s in subgraphs[i + 1 :] for name in s.input_names}
        assert not set(subgraph.consumed_names) & later_inputs
        assert set(subgraph.consumed_names) <= set(subgraph.input_names)
