"""True-sequential calibration: dependency stages, each fed by the compressed stages before it."""

from __future__ import annotations

import weakref

import torch

from llmc_trace import trace_subgraphs
from llmc_trace.pipelines.sequential import run_sequential
from llmc_trace.pipelines.stages import _producing_layers, dependency_stages
from tests.conftest import tiny_llama, token_batch


def test_a_llama_layer_has_four_stages_in_dependency_order() -> None:
    model = tiny_llama(layers=1)
    layer = model.model.layers[0]
    layers = [
        (name, module)
        for name, module in layer.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    with torch.no_grad():
        stages = dependency_stages(lambda: model(**token_batch(), use_cache=False), layers)
    names = [sorted(name.split(".")[-1] for name, _ in stage) for stage in stages]
    assert names == [
        ["k_proj", "q_proj", "v_proj"],
        ["o_proj"],
        ["gate_proj", "up_proj"],
        ["down_proj"],
    ]
    assert all(p.requires_grad for p in layer.parameters())  # left as it found them


class _Node:
    """An autograd node as Python sees it: ``next_functions`` hands out each node's object,
    made on demand and kept only while something references it (as autograd's are)."""

    live: weakref.WeakValueDictionary[int, _Node] = weakref.WeakValueDictionary()

    def __init__(self, key: int, graph: dict[int, list[int]]) -> None:
        self.key, self.graph = key, graph

    @classmethod
    def of(cls, key: int, graph: dict[int, list[int]]) -> _Node:
        node = cls.live.get(key)
        if node is None:
            node = cls(key, graph)
            cls.live[key] = node
        return node

    @property
    def next_functions(self) -> tuple[tuple[_Node, int], ...]:
        return tuple((_Node.of(k, self.graph), 0) for k in self.graph.get(self.key, []))


def test_the_walk_to_the_producing_layers_is_not_cut_by_a_reused_object_id() -> None:
    """A chain of 40 nodes whose objects are freed as the walk passes them: a new object can
    take a freed one's id, and a walk that kept ids alone read it as seen and stopped."""
    chain = {k: [k + 1] for k in range(40)}
    produced = _Node.of(40, chain)  # the layer's output node, alive as the pipeline keeps it
    assert _producing_layers(_Node.of(0, chain), {produced: "q_proj"}) == {"q_proj"}


class HalvingRecorder:
    """Records every Linear's inputs, then halves each stage's weights once it is calibrated."""

    def __init__(self) -> None:
        self.seen: dict[str, list[torch.Tensor]] = {}
        self.handles: list = []
        self.stages: list[list[str]] = []

    def wants(self, modules) -> bool:
        return any(isinstance(m, torch.nn.Linear) and "layers" in n for n, m in modules)

    def passes(self, modules):  # type: ignore[no-untyped-def]
        return [modules]

    def on_subgraph_start(self, index, modules) -> None:
        stage = [n for n, m in modules if isinstance(m, torch.nn.Linear) and "layers" in n]
        self.stages.append(stage)
        for name in stage:
            self.handles.append(dict(modules)[name].register_forward_pre_hook(self._record(name)))

    def _record(self, name: str):  # type: ignore[no-untyped-def]
        def record(module: torch.nn.Module, args: tuple) -> None:
            self.seen.setdefault(name, []).append(args[0].clone())

        return record

    def on_batch(self, batch) -> None:
        return None

    def on_calibrated(self, index, modules) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        with torch.no_grad():
            for name, module in modules:
                if isinstance(module, torch.nn.Linear) and "layers" in name:
                    module.weight.mul_(0.5)

    def on_subgraph_end(self, index, modules) -> None:
        return None


def test_each_stage_sees_inputs_from_the_already_compressed_stages() -> None:
    """Reference: the whole model run eagerly after halving, stage by stage, what came before."""
    batches = [token_batch(2, 12, seed=s) for s in range(3)]
    model = tiny_llama(layers=2)
    reference_model = tiny_llama(layers=2)
    recorder = HalvingRecorder()
    subgraphs = trace_subgraphs(model, batches[0], ["LlamaDecoderLayer"])
    stats = run_sequential(model, subgraphs, batches, recorder, true_sequential=True)
    assert stats.passes == [1, 5, 4]  # embeddings; 4 stages + propagation; 4 stages (last)
    assert len(recorder.stages) == 8
    modules = dict(reference_model.named_modules())
    for stage in recorder.stages:
        expected = HalvingRecorder()
        handles = [
            modules[name].register_forward_pre_hook(expected._record(name)) for name in stage
        ]
        with torch.no_grad():
            for batch in batches:
                reference_model(**batch, use_cache=False)
            for name in stage:
                modules[name].weight.mul_(0.5)
        for handle in handles:
            handle.remove()
        for name in stage:
            assert len(recorder.seen[name]) == len(batches), name  # once per batch: early stop
            for got, want in zip(recorder.seen[name], expected.seen[name], strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
