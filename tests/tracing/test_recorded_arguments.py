"""Closures, objects and ``None`` results around recorded calls, each replayed on a new batch.

Distilled from models that broke: Gemma 3 hands its mask builder a closure over a traced
tensor, Idefics3 hands ``torch_compilable_check`` a lambda, a forward that builds and returns a
``DynamicCache``, Qwen2-Audio's merge statement leaves ``position_ids`` ``None``, and PI0's
decoder layers fill a cache its later code measures, after drawing its time and noise.
"""

from __future__ import annotations

import pytest
import torch
from transformers.utils import torch_compilable_check

from llmc_trace import trace_subgraphs
from llmc_trace.errors import VerificationError
from llmc_trace.graph.verify import replay
from llmc_trace.tracing.rebuild import RebuildFunction, RebuildObject
from tests.conftest import tiny_llama


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def overlay(ids: torch.Tensor):  # noqa: ANN201 - returns a closure, as mask overlays do
    """A mask-function factory: the closure reads ``ids`` when called."""

    def shifted(column: int) -> torch.Tensor:
        return ids[..., column]

    return shifted


def add_overlay(x: torch.Tensor, overlay_fn) -> torch.Tensor:  # noqa: ANN001
    if bool(x.sum() > 1e9):  # a data-dependent branch: only a recorded call may take it
        return x
    return x + overlay_fn(0).unsqueeze(-1)


class ClosureModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x)
        h = add_overlay(h, overlay(h * 3))
        return self.blocks[1](h)


def test_a_closure_over_a_traced_value_is_rebuilt_from_each_batch() -> None:
    torch.manual_seed(0)
    model = ClosureModel().eval()
    subgraphs = trace_subgraphs(
        model, {"x": torch.randn(2, 3, 4)}, ["Block"], tracing_ignore=["add_overlay"]
    )
    targets = [n.target for s in subgraphs for n in s.graph.nodes if n.op == "call_function"]
    assert any(isinstance(t, RebuildFunction) for t in targets)
    other = {"x": torch.randn(2, 3, 4) * 5}  # a baked-in closure would keep the first batch
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, other), model(**other))


class CheckedModel(torch.nn.Module):
    """Idefics3's pattern: a check whose message is a lambda over traced values."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor, limit: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x)
        torch_compilable_check(
            (h.abs().amax() < limit).all(), lambda: f"too large: {h.abs().amax().item():.1f}"
        )
        return self.blocks[1](h)


def test_a_lambda_argument_of_a_check_runs_on_the_batch() -> None:
    torch.manual_seed(0)
    model = CheckedModel().eval()
    sample = {"x": torch.randn(2, 4), "limit": torch.tensor(1e6)}
    subgraphs = trace_subgraphs(model, sample, ["Block"])
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, sample), model(**sample))
        big = {"x": torch.full((2, 4), 1e3), "limit": torch.tensor(1.0)}
        with pytest.raises(ValueError) as eager:
            model(**big)
        with pytest.raises(ValueError) as replayed:
            replay(model, subgraphs, big)
    assert str(replayed.value) == str(eager.value)  # the message came from this batch


@pytest.mark.parametrize(
    ("targets", "attention"), [(["LlamaDecoderLayer"], "sdpa"), (["Linear"], "eager")]
)
def test_a_forward_that_builds_and_returns_a_dynamic_cache(
    targets: list[str], attention: str
) -> None:
    """Decoder layers (leaves) fill the cache at run time, or traced attention code does at
    trace time; either way each batch gets a cache of its own, filled as eager fills it."""
    model = tiny_llama(layers=2, attention=attention).model  # the LlamaModel: it builds the cache
    sample = {"input_ids": torch.randint(0, 128, (1, 8)), "use_cache": True}
    subgraphs = trace_subgraphs(model, sample, targets)
    targets_called = [n.target for s in subgraphs for n in s.graph.nodes if n.op == "call_function"]
    assert any(isinstance(t, RebuildObject) for t in targets_called)
    with torch.no_grad():
        expected = model(**sample)
        first = replay(model, subgraphs, sample)
        second = replay(model, subgraphs, sample)
    assert first.past_key_values is not second.past_key_values
    torch.testing.assert_close(first.last_hidden_state, expected.last_hidden_state)
    for cache in (first.past_key_values, second.past_key_values):
        assert len(cache.layers) == len(expected.past_key_values.layers)
        for ours, theirs in zip(cache.layers, expected.past_key_values.layers):
            torch.testing.assert_close(ours.keys, theirs.keys)
            torch.testing.assert_close(ours.values, theirs.values)


def merge(h: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Qwen2-Audio's merge statement: positions only when the tokens ask for them."""
    if bool((ids < 0).any()):
        return h, torch.arange(h.shape[1]).expand(h.shape[0], -1)
    return h * 2, None


class MergeModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h, positions = merge(self.blocks[0](x), ids)
        if positions is None:  # a proxy would never be None: this branch must be taken
            positions = torch.zeros(h.shape[:2], dtype=torch.long)
        return self.blocks[1](h + positions.unsqueeze(-1))


def test_a_none_result_of_a_recorded_call_stays_none_and_is_checked() -> None:
    torch.manual_seed(0)
    model = MergeModel().eval()
    sample = {"x": torch.randn(2, 3, 4), "ids": torch.ones(2, 3, dtype=torch.long)}
    subgraphs = trace_subgraphs(model, sample, ["Block"], tracing_ignore=["merge"])
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, sample), model(**sample))
        other_path = {"x": torch.randn(2, 3, 4), "ids": -torch.ones(2, 3, dtype=torch.long)}
        with pytest.raises(VerificationError, match="was None when the model was traced"):
            replay(model, subgraphs, other_path)


class RootMethodModel(torch.nn.Module):
    """Qwen2.5-Omni's thinker on transformers 5.17: the model's own method, recorded as one
    call, is handed the model itself (``self.get_audio_features(...)`` at the top level)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.gain = torch.nn.Parameter(torch.tensor(2.0))

    def rescaled(self, h: torch.Tensor) -> torch.Tensor:
        if bool(h.abs().amax() > 1e9):  # a data-dependent branch: only a recorded call may take it
            return h
        return h * self.gain + self.blocks[0].proj.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](self.rescaled(self.blocks[0](x)))


def test_a_recorded_method_of_the_model_itself_replays() -> None:
    torch.manual_seed(0)
    model = RootMethodModel().eval()
    subgraphs = trace_subgraphs(
        model, {"x": torch.randn(2, 4)}, ["Block"], tracing_ignore=["RootMethodModel.rescaled"]
    )
    other = {"x": torch.randn(3, 4) * 5}
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, other), model(**other))


class Memory:
    """A plain object that leaves fill, as decoder layers fill a ``DynamicCache``."""

    def __init__(self) -> None:
        self.entries: list[torch.Tensor] = []

    def length(self) -> int:
        return sum(entry.shape[1] for entry in self.entries)


class Writer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, memory: Memory) -> torch.Tensor:
        memory.entries.append(self.proj(x))
        return x + 1


class Reader(torch.nn.Module):
    def forward(self, y: torch.Tensor, memory: Memory) -> torch.Tensor:
        return y + torch.cat(memory.entries, dim=1).mean(dim=1, keepdim=True)


def span_mask(y: torch.Tensor, memory: Memory) -> torch.Tensor:
    """A mask over the memory and the new positions, sized by what the memory holds."""
    return torch.ones(y.shape[0], memory.length() + y.shape[1])


class PrefixModel(torch.nn.Module):
    """PI0's pattern: the writers' outputs are dropped; only the memory they filled carries
    on, read by model code (its length), by a recorded call, and by the reader."""

    def __init__(self) -> None:
        super().__init__()
        self.writers = torch.nn.ModuleList([Writer(), Writer()])
        self.reader = Reader()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        memory = Memory()
        for writer in self.writers:
            x = writer(x, memory)
        held = memory.length()
        mask = span_mask(y, memory)
        return self.reader(y, memory) * mask[:, :held].sum(dim=-1).view(-1, 1, 1)


def test_what_a_leaf_writes_into_an_object_is_read_back_after_it() -> None:
    torch.manual_seed(0)
    model = PrefixModel().eval()
    sample = {"x": torch.randn(2, 3, 4), "y": torch.randn(2, 5, 4)}
    subgraphs = trace_subgraphs(
        model, sample, ["Writer", "Reader"], tracing_ignore=["span_mask"], fix=False
    )
    placed = {
        getattr(node.target, "__name__", node.target): subgraph.index
        for subgraph in subgraphs
        for node in subgraph.graph.nodes
        if node.op in ("call_function", "call_module")
    }
    assert placed["span_mask"] >= placed["writers.1"], placed  # not before the writes it reads
    other = {"x": torch.randn(2, 3, 4) * 3, "y": torch.randn(2, 5, 4)}
    with torch.no_grad():
        torch.testing.assert_close(replay(model, subgraphs, other), model(**other))


class NoisyModel(torch.nn.Module):
    """PI0's flow-matching draws, on plain arguments: a time from a ``Beta`` and noise."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0)).sample((2,))
        noise = torch.randn(2, 3, 4)
        return self.blocks[1](self.blocks[0](x) * time.view(-1, 1, 1) + noise)


def test_random_draws_are_drawn_again_on_each_run() -> None:
    torch.manual_seed(0)
    model = NoisyModel().eval()
    sample = {"x": torch.randn(2, 3, 4)}
    subgraphs = trace_subgraphs(model, sample, ["Block"])
    runs = {}
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            expected = model(**sample)
            torch.manual_seed(seed)
            runs[seed] = replay(model, subgraphs, sample)
            torch.testing.assert_close(runs[seed], expected)  # the draws, in eager's order
    assert (runs[1] - runs[2]).abs().amax() > 0.1  # not one draw baked into the graph
