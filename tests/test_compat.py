"""llm-compressor's helper and cache API (llmc_trace.compat), checked against references
computed another way: a walk of the module tree, the last reader of each name found by a
forward scan, eager forwards, and the values each batch was given."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import pytest
import torch
from torch import fx

from llmc_trace.compat import (
    MODEL_OUTPUT,
    IntermediatesCache,
    Subgraph,
    find_target_nodes,
    get_sequential_ancestors,
    graph_is_well_formed,
    partition_graph,
    populate_concrete_args,
    topological_partition,
    trace_consumed_names,
    trace_subgraphs,
)
from llmc_trace.errors import BadInputError
from llmc_trace.compat.arguments import DEFAULT_TRACING_IGNORE
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.conftest import tiny_llama, token_batch

#: llm-compressor 0.14's default ``tracing_ignore`` (DatasetArguments): names of many models.
LLMC_IGNORE = list(DEFAULT_TRACING_IGNORE)


def ancestors_by_walk(
    model: torch.nn.Module, targets: set[torch.nn.Module]
) -> set[torch.nn.Module]:
    """Modules with a target strictly below them, not looking inside targets."""
    found: set[torch.nn.Module] = set()

    def holds_target(module: torch.nn.Module) -> bool:
        if module in targets:
            return True
        below = [holds_target(child) for child in module.children()]  # visit every child
        if any(below):
            found.add(module)
        return any(below)

    holds_target(model)
    return found


def traced_llama(layers: int = 3) -> tuple[torch.nn.Module, fx.GraphModule]:
    model = tiny_llama(layers=layers)
    options = TracingOptions.parse(model, [], ["LlamaDecoderLayer"])
    return model, fx.GraphModule(model, trace_graph(model, token_batch(), options).graph)


def last_readers(subgraphs: list[Subgraph]) -> dict[str, int]:
    """For each name, the index of the last subgraph that reads it (a forward scan)."""
    last: dict[str, int] = {}
    for i, subgraph in enumerate(subgraphs):
        for name in subgraph.input_names:
            last[name] = i
    return last


def test_sequential_ancestors_are_the_modules_above_the_targets() -> None:
    model = tiny_llama(layers=2)
    layer = model.model.layers[0]
    cases = [
        set(model.model.layers),
        {layer.self_attn.q_proj, model.lm_head},
        {layer, layer.mlp.up_proj},  # a target inside a target is not walked into
        {model},
        {model, model.lm_head},  # the root as a target: nothing is walked into
        set(),
    ]
    for targets in cases:
        assert get_sequential_ancestors(model, targets) == ancestors_by_walk(model, targets)
    assert model.model in get_sequential_ancestors(model, cases[0])


@pytest.mark.parametrize("per_subgraph", [1, 2])
def test_every_target_sits_in_exactly_one_subgraph(per_subgraph: int) -> None:
    model, graph_module = traced_llama(layers=3)
    targets = set(model.model.layers)
    paths = {f"model.layers.{i}" for i in range(3)}
    expected_nodes = {
        node
        for node in graph_module.graph.nodes
        if node.op == "call_module" and node.target in paths
    }
    assert find_target_nodes(graph_module, targets) == expected_nodes

    subgraphs = partition_graph(model, topological_partition(graph_module, targets, per_subgraph))
    calls = [
        [node.target for node in subgraph.graph.nodes if node.op == "call_module"]
        for subgraph in subgraphs
    ]
    for path in paths:
        assert sum(path in called for called in calls) == 1
    assert all(sum(path in paths for path in called) <= per_subgraph for called in calls)
    assert all(subgraph.consumed_names == set() for subgraph in subgraphs)  # not traced yet
    assert all(graph_is_well_formed(subgraph.graph) for subgraph in subgraphs)


def test_consumed_names_are_dropped_after_their_last_reader() -> None:
    model, graph_module = traced_llama(layers=3)
    partitions = topological_partition(graph_module, set(model.model.layers))
    subgraphs = partition_graph(model, partitions)
    trace_consumed_names(subgraphs)
    last = last_readers(subgraphs)
    for i, subgraph in enumerate(subgraphs):
        assert subgraph.consumed_names == {n for n in subgraph.input_names if last[n] == i}
    dropped = {name for subgraph in subgraphs for name in subgraph.consumed_names}
    assert dropped == set(last)  # every name is dropped once, by its last reader


@pytest.mark.parametrize(
    ("input_names", "expected"),
    [
        ([{"tokens", "mask"}, {"hidden_0", "mask"}, {"hidden_1", "mask"}],
         [{"tokens"}, {"hidden_0"}, {"hidden_1", "mask"}]),
        ([{"input", "skip"}, {"hidden_0"}, {"hidden_1", "skip"}],
         [{"input"}, {"hidden_0"}, {"hidden_1", "skip"}]),
    ],
)  # fmt: skip
def test_consumed_names_of_subgraphs_built_as_llm_compressor_builds_them(
    input_names: list[set[str]], expected: list[set[str]]
) -> None:
    subgraphs = [
        Subgraph(graph=fx.Graph(), input_names=names, consumed_names=set()) for names in input_names
    ]
    trace_consumed_names(subgraphs)
    assert [subgraph.consumed_names for subgraph in subgraphs] == expected
    assert [subgraph.input_names for subgraph in subgraphs] == input_names


def small_graph() -> tuple[fx.Graph, fx.Node, fx.Node]:
    graph = fx.Graph()
    x = graph.placeholder("x")
    doubled = graph.call_function(operator.mul, (x, 2))
    shifted = graph.call_function(operator.add, (doubled, 1))
    graph.output({"shifted": shifted})
    return graph, doubled, shifted


def test_well_formed_graphs_are_accepted_and_broken_ones_refused() -> None:
    _, graph_module = traced_llama(layers=2)
    assert graph_is_well_formed(graph_module.graph)
    assert graph_is_well_formed(small_graph()[0])

    used_before_defined, doubled, shifted = small_graph()
    doubled.prepend(shifted)  # `shifted` now runs before the value it adds to
    assert not graph_is_well_formed(used_before_defined)

    one_sided, doubled, shifted = small_graph()
    del doubled.users[shifted]  # the edge is recorded at one end only
    assert not graph_is_well_formed(one_sided)

    foreign, doubled, _ = small_graph()
    elsewhere = fx.Graph().placeholder("y")  # an input from another graph: it dangles here
    with foreign.inserting_before(doubled):
        foreign.call_function(operator.neg, (elsewhere,))
    assert not graph_is_well_formed(foreign)


def test_a_broken_graph_or_no_targets_per_subgraph_is_bad_input() -> None:
    model, graph_module = traced_llama(layers=2)
    with pytest.raises(BadInputError, match="targets_per_subgraph"):
        topological_partition(graph_module, set(model.model.layers), 0)
    nodes = [node for node in graph_module.graph.nodes if node.op == "call_module"]
    nodes[0].prepend(nodes[1])
    with pytest.raises(BadInputError, match="not well formed"):
        topological_partition(graph_module, set(model.model.layers))


def test_subgraph_built_as_llm_compressor_builds_it_runs_as_a_dict() -> None:
    graph, _, _ = small_graph()
    for subgraph in (
        Subgraph(graph, {"x"}, {"x"}),
        Subgraph(graph=graph, input_names={"x"}, consumed_names={"x"}),
    ):
        x = torch.randn(3)
        assert subgraph.output_names == ["shifted"]
        assert subgraph.input_names == subgraph.consumed_names == {"x"}
        torch.testing.assert_close(subgraph.forward(torch.nn.Module(), x=x), {"shifted": x * 2 + 1})


def test_subgraphs_run_through_the_cache_reproduce_the_model() -> None:
    """llm-compressor's sequential loop, unchanged: update, then delete the consumed names."""
    model = tiny_llama(layers=3)
    batches = [token_batch(seed=seed) for seed in range(3)]
    subgraphs = trace_subgraphs(model, batches[0], ["LlamaDecoderLayer"], LLMC_IGNORE)
    assert [s.targets for s in subgraphs] == [[], *[[f"model.layers.{i}"] for i in range(3)]]
    assert subgraphs[1].submodules(model, recurse=False) == [model.model.layers[0]]
    assert subgraphs[1].submodules(model) == list(model.model.layers[0].modules())
    cache = IntermediatesCache.from_dataloader(batches, model_device="cpu")
    with torch.no_grad():
        for position, subgraph in enumerate(subgraphs):
            for batch_index, inputs in enumerate(cache.iter(subgraph.input_names)):
                outputs = subgraph.forward(model, **inputs)
                if position < len(subgraphs) - 1:
                    cache.update(batch_index, outputs)
                    cache.delete(batch_index, subgraph.consumed_names)
                else:
                    expected = model(**batches[batch_index]).logits
                    torch.testing.assert_close(outputs[MODEL_OUTPUT].logits, expected)
    assert "create_causal_mask" in cache.intermediates.shared_names  # stored once


@dataclass(frozen=True)
class Nested:
    a: int
    b: torch.Tensor | None = None
    c: Nested | None = None


def equal(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)  # type: ignore[arg-type]
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)  # type: ignore[attr-defined]
    if isinstance(a, Nested):
        return equal(vars(a), vars(b))
    return a == b


def mixed_batches() -> list[dict[str, object]]:
    return [
        {
            "ids": torch.arange(6).reshape(2, 3) + i,
            "pair": (torch.full((2,), float(i)), torch.ones(2)),
            "record": Nested(a=i, b=torch.randn(2, 3), c=Nested(a=64)),
            "dtype": torch.float32,
            "numbers": [1, 2, i],
        }
        for i in range(3)
    ]


def test_the_cache_hands_back_what_it_was_given() -> None:
    batches = mixed_batches()
    cache = IntermediatesCache.from_dataloader(batches)
    assert len(cache) == 3
    assert all(equal(cache.fetch(i), batch) for i, batch in enumerate(batches))
    assert all(equal(got, batch) for got, batch in zip(cache, batches))
    assert cache.fetch(1, ["ids", "absent"]).keys() == {"ids"}  # names a batch lacks: skipped

    fetched = cache.fetch(0, ["ids"])["ids"]
    fetched.add_(100)  # the caller's copy: the cache keeps its own
    assert equal(cache.fetch(0, ["ids"])["ids"], batches[0]["ids"])


def test_update_and_delete_change_exactly_the_names_given() -> None:
    batches = mixed_batches()
    cache = IntermediatesCache.from_dataloader(batches)
    hidden = [torch.randn(2, 3, 4) for _ in batches]
    for i, value in enumerate(hidden):
        cache.update(i, {"hidden": value})
        cache.delete(i, ["ids", "pair"])
    for i, batch in enumerate(batches):
        kept = {name: value for name, value in batch.items() if name not in ("ids", "pair")}
        assert equal(cache.fetch(i), {**kept, "hidden": hidden[i]})
    with pytest.raises(BadInputError, match="'ids'"):
        cache.delete(0, ["ids"])
    cache.delete(2)
    assert cache.fetch(2) == {}
    assert equal(cache.fetch(1)["hidden"], hidden[1])


def test_storing_before_deleting_never_overwrites_a_value_still_held() -> None:
    """A batch's output may take over the rows its consumed input frees; stored before the
    input of the same batch is deleted (llm-compressor's order), it must not land there."""
    inputs = [torch.full((4,), float(i)) for i in range(3)]
    outputs = [torch.full((4,), 10.0 + i) for i in range(3)]
    cache = IntermediatesCache([{"x": value} for value in inputs])
    cache.delete(0, ["x"])
    cache.update(0, {"y": outputs[0]})
    for i in (1, 2):
        cache.update(i, {"y": outputs[i]})
        assert equal(cache.fetch(i, ["x"])["x"], inputs[i])
        cache.delete(i, ["x"])
    assert all(equal(cache.fetch(i)["y"], outputs[i]) for i in range(3))


def test_appended_batches_come_back_as_given() -> None:
    cache = IntermediatesCache(None, "cpu")
    values = [torch.randn(2, 5) for _ in range(4)]
    for value in values:
        cache.append({"args": value})
    assert [equal(batch["args"], value) for batch, value in zip(cache, values)] == [True] * 4
    empty = IntermediatesCache.empty(2, "cpu")
    assert list(empty) == [{}, {}]


def test_values_are_offloaded_and_fetched_onto_the_model_device() -> None:
    batches = [{"ids": torch.arange(4) + i} for i in range(2)]
    cache = IntermediatesCache.from_dataloader(batches, model_device="meta", offload_device="cpu")
    assert all(v.device.type == "cpu" for b in cache.intermediates.batches for v in b.values())
    fetched = cache.fetch(1)["ids"]
    assert (fetched.device.type, fetched.shape, fetched.dtype) == ("meta", (4,), torch.int64)
    cache.update(1, {"hidden": torch.ones(3)})  # produced on the CPU: fetched back there
    assert equal(cache.fetch(1, ["hidden"])["hidden"], torch.ones(3))

    kept = IntermediatesCache.from_dataloader(batches[:1], model_device="meta", offload_device=None)
    assert kept.intermediates.batches[0]["ids"].device.type == "meta"
    with pytest.raises(BadInputError, match="map input names"):
        IntermediatesCache.from_dataloader([torch.ones(2)])  # type: ignore[list-item]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_values_move_between_the_cpu_and_the_gpu() -> None:
    batches = [{"ids": torch.arange(4) + i} for i in range(2)]
    cache = IntermediatesCache.from_dataloader(batches, model_device="cuda", offload_device="cpu")
    assert cache.fetch(0)["ids"].device.type == "cuda"
    cache.update(0, {"hidden": torch.randn(2, 3, device="cuda")})
    assert cache.intermediates.batches[0]["hidden"].device.type == "cpu"
    assert cache.fetch(0, ["hidden"])["hidden"].device.type == "cuda"


def test_concrete_args_are_every_forward_parameter_the_sample_lacks() -> None:
    class Forward(torch.nn.Module):
        def forward(self, x, mask=None, use_cache=True, *args, scale=2.0, **kwargs):  # type: ignore[no-untyped-def]
            return x

    sample = {"x": torch.ones(1)}
    expected = {"mask": None, "use_cache": False, "args": [], "scale": 2.0, "kwargs": {}}
    assert populate_concrete_args(Forward(), sample) == expected
    assert "use_cache" not in populate_concrete_args(Forward(), {**sample, "use_cache": True})
    with pytest.raises(BadInputError, match="'x'"):
        populate_concrete_args(Forward(), {})
