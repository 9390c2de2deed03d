"""llm-compressor's pipeline API (llmc_trace.compat), checked against references computed
another way: the inputs each target receives in an eager run of the model with the same
hooks, a hand-written walk of the module tree, and the model's own outputs."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import fx
from torch.utils._pytree import tree_map

from llmc_trace.compat import (
    BasicPipeline,
    CalibrationCallbacks,
    CalibrationPipeline,
    DataFreePipeline,
    IndependentPipeline,
    LayerSequentialPipeline,
    SequentialPipeline,
    SequentialTracer,
    dispatch_for_sequential,
    get_sequential_ancestors,
    get_sequential_targets,
    match_modules,
    pipeline_arguments,
)
from llmc_trace.compat.dispatch import main_device, onload_device
from llmc_trace.errors import BadInputError
from llmc_trace.models.build import build_twin
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import resolve_model
from tests.conftest import tiny_llama, token_batch

Calls = dict[str, list[tuple[Any, Any]]]


def recorder(calls: Calls, path: str) -> Callable[..., None]:
    """A forward pre-hook keeping a copy of what the module at ``path`` is called with."""

    def record(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        copy = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, (args, kwargs))
        calls[path].append(copy)

    return record


def target_paths(model: torch.nn.Module, cls: str) -> list[str]:
    return [p for p, m in model.named_modules() if any(c.__name__ == cls for c in type(m).__mro__)]


def eager_calls(model: torch.nn.Module, paths: list[str], batches: list[dict[str, Any]]) -> Calls:
    """Each target's calls in plain forwards, hooked with torch alone (caches off, as the
    pipelines run the model)."""
    calls: Calls = defaultdict(list)
    handles = [
        model.get_submodule(p).register_forward_pre_hook(recorder(calls, p), with_kwargs=True)
        for p in paths
    ]
    with torch.no_grad():
        for batch in batches:
            model(**batch, use_cache=False)
    for handle in handles:
        handle.remove()
    return calls


def pipeline_calls(
    pipeline: type[CalibrationPipeline],
    model: torch.nn.Module,
    paths: list[str],
    batches: list[dict[str, Any]],
    args: Any,
    compress: Callable[[list[torch.nn.Module]], None] | None = None,
) -> Calls:
    calls: Calls = defaultdict(list)
    callbacks = CalibrationCallbacks(sequential_epoch_end=compress)
    for path in paths:
        callbacks.register_hook(
            model.get_submodule(path), recorder(calls, path), "forward_pre", with_kwargs=True
        )
    pipeline(callbacks)(model, batches, args)
    callbacks.remove_hooks()
    return calls


def assert_same(actual: Any, expected: Any, where: str) -> None:
    """Exactly equal values: tensors element for element, containers item by item."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), where
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    else:
        assert actual == expected, where


def assert_same_calls(actual: Calls, expected: Calls, paths: list[str], batches: int) -> None:
    for path in paths:
        assert len(expected[path]) == batches  # the eager reference saw each target once
        assert len(actual[path]) == batches, f"{path} heard {len(actual[path])} calls"
        for index, (got, want) in enumerate(zip(actual[path], expected[path])):
            assert_same(got, want, f"{path} batch {index}")


def llama_batches(count: int = 3) -> list[dict[str, torch.Tensor]]:
    return [token_batch(batch=2, seed=seed) for seed in range(count)]


def qwen2_vl_with_images() -> tuple[torch.nn.Module, list[dict[str, Any]]]:
    """Qwen2-VL's tiny twin and image batches: it traces only with a fix (get_rope_index),
    which the pipeline finds and proves itself."""
    model = build_twin(resolve_model("Qwen/Qwen2-VL-2B-Instruct"), seed=1)
    batches = [
        make_sample(model.config, "image", SampleOptions(seq_len=32, seed=seed))
        for seed in range(2)
    ]
    return model, batches


CASES = {
    "llama-layers": lambda: (tiny_llama(layers=3), llama_batches(), "LlamaDecoderLayer", None),
    "llama-linear": lambda: (tiny_llama(layers=2), llama_batches(2), "Linear", ["Linear"]),
    "qwen2-vl-image": lambda: (*qwen2_vl_with_images(), "Qwen2VLDecoderLayer", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sequential_pipeline_hands_every_target_its_eager_inputs(case: str) -> None:
    model, batches, cls, targets = CASES[case]()
    paths = target_paths(model, cls)
    if case == "qwen2-vl-image":
        paths = [p for p in paths if ".visual." not in p]  # the default targets
        assert "pixel_values" in batches[0] and paths
    expected = eager_calls(model, paths, batches)
    args = {"sequential_targets": targets}
    actual = pipeline_calls(SequentialPipeline, model, paths, batches, args)
    assert_same_calls(actual, expected, paths, len(batches))


@pytest.mark.parametrize("case", ["llama-layers", "qwen2-vl-image"])
def test_layer_sequential_pipeline_hands_every_target_its_eager_inputs(case: str) -> None:
    """Where each layer receives the previous one's output and the same other arguments:
    Llama, and Qwen2-VL's language model behind its vision tower."""
    model, batches, cls, _ = CASES[case]()
    paths = [p for p in target_paths(model, cls) if ".visual." not in p]
    expected = eager_calls(model, paths, batches)
    actual = pipeline_calls(LayerSequentialPipeline, model, paths, batches, None)
    assert_same_calls(actual, expected, paths, len(batches))


def test_a_model_in_training_mode_calibrates_as_in_eval_and_stays_in_training() -> None:
    """Attention dropout would make every batch's inputs random: the pipelines run the model
    in eval mode, as llm-compressor's calibration context does, and restore its mode."""
    model, batches = tiny_llama(layers=2), llama_batches(2)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    paths = target_paths(model, "LlamaDecoderLayer")
    expected = eager_calls(model, paths, batches)  # tiny_llama is in eval mode
    model.train()
    actual = pipeline_calls(SequentialPipeline, model, paths, batches, None)
    assert all(module.training for module in model.modules())
    assert_same_calls(actual, expected, paths, len(batches))


def test_basic_pipeline_hands_every_target_its_eager_inputs() -> None:
    model, batches = tiny_llama(layers=2), llama_batches(2)
    paths = target_paths(model, "Linear")
    expected = eager_calls(model, paths, batches)
    actual = pipeline_calls(BasicPipeline, model, paths, batches, None)
    assert_same_calls(actual, expected, paths, len(batches))


def test_output_hooks_hear_what_eager_outputs_are() -> None:
    """A hook on a layer's output, and on its last-called child's, hears every batch: a
    calibration pass runs to its end even when a propagation pass will follow."""
    model, batches = tiny_llama(layers=2), llama_batches(2)
    paths = [p for i in range(2) for p in (f"model.layers.{i}", f"model.layers.{i}.mlp.down_proj")]

    def keep(outputs: Calls, path: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            outputs[path].append(tree_map(lambda v: v.clone(), output))

        return hook

    expected: Calls = defaultdict(list)
    handles = [model.get_submodule(p).register_forward_hook(keep(expected, p)) for p in paths]
    with torch.no_grad():
        for batch in batches:
            model(**batch, use_cache=False)
    for handle in handles:
        handle.remove()
    actual: Calls = defaultdict(list)
    callbacks = CalibrationCallbacks()
    for path in paths:
        callbacks.register_hook(model.get_submodule(path), keep(actual, path), "forward")
    SequentialPipeline(callbacks)(model, batches, {"propagate_error": True})
    assert_same_calls(actual, expected, paths, len(batches))


def round_linears(modules: list[torch.nn.Module]) -> None:
    """A stand-in compressor: every Linear weight rounded to multiples of 1/4."""
    for module in modules:
        if isinstance(module, torch.nn.Linear):
            module.weight.data.mul_(4).round_().div_(4)


@pytest.mark.parametrize("pipeline", [SequentialPipeline, LayerSequentialPipeline])
@pytest.mark.parametrize("propagate_error", [True, False])
def test_later_targets_see_the_compressed_outputs_exactly_when_error_propagates(
    pipeline: type[CalibrationPipeline], propagate_error: bool
) -> None:
    """A layer's inputs depend only on the layers before it, so with error propagation they
    are an eager run's on the model as the pipeline left it (every layer compressed), and
    without it an eager run's on the model as it was."""
    model, batches = tiny_llama(layers=3), llama_batches(2)
    paths = target_paths(model, "LlamaDecoderLayer")
    before = eager_calls(model, paths, batches)
    args = {"propagate_error": propagate_error}
    actual = pipeline_calls(pipeline, model, paths, batches, args, compress=round_linears)
    assert all(
        torch.equal(m.weight, m.weight.mul(4).round().div(4))
        for p in paths
        for m in model.get_submodule(p).modules()
        if isinstance(m, torch.nn.Linear)
    )
    expected = eager_calls(model, paths, batches) if propagate_error else before
    assert_same_calls(actual, expected, paths, len(batches))


def test_events_in_order_and_every_module_in_one_step() -> None:
    model, batches = tiny_llama(layers=2), llama_batches(2)
    events: list[Any] = []
    callbacks = CalibrationCallbacks(
        calibration_epoch_start=lambda: events.append("start"),
        sequential_epoch_end=lambda modules: events.append(modules),
        calibration_epoch_end=lambda: events.append("end"),
    )
    SequentialPipeline(callbacks)(model, batches, None)
    assert events[0] == "start" and events[-1] == "end"
    steps = events[1:-1]
    stepped = [id(m) for step in steps for m in step]
    containers = {id(model), id(model.model), id(model.model.layers)}  # never called themselves
    assert sorted(stepped) == sorted(id(m) for m in model.modules() if id(m) not in containers)
    layers = {id(m): i for i, m in enumerate(model.model.layers)}
    assert [next(layers[id(m)] for m in step if id(m) in layers) for step in steps[1:]] == [0, 1]


def test_hooks_are_silent_while_tracing_and_propagating_and_heard_outside() -> None:
    model, batches = tiny_llama(layers=2), llama_batches(2)
    heard: list[int] = []
    callbacks = CalibrationCallbacks()
    callbacks.register_hook(model.model.layers[1], lambda m, a: heard.append(callbacks.batch_index))
    SequentialPipeline(callbacks)(model, batches, {"propagate_error": True})
    assert heard == [0, 1]  # one calibration pass over two batches
    with torch.no_grad():
        model(**batches[0])
    assert len(heard) == 3  # outside a pipeline, a hook is an ordinary hook


def test_data_free_pipeline_steps_through_targets_then_the_rest_without_data() -> None:
    model = tiny_llama(layers=2)
    steps: list[list[torch.nn.Module]] = []
    callbacks = CalibrationCallbacks(sequential_epoch_end=steps.append)
    DataFreePipeline(callbacks)(model, None, None)
    layers = list(model.model.layers)
    assert [s[0] for s in steps[:2]] == layers
    assert sorted(id(m) for s in steps for m in s) == sorted(id(m) for m in model.modules())


def test_layer_sequential_refuses_a_model_that_works_between_targets() -> None:
    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks[1](torch.relu(self.blocks[0](x)) - 1)

    batches = [{"x": torch.randn(2, 4)}]
    with pytest.raises(RuntimeError, match="not exact"):
        LayerSequentialPipeline()(Stack(), batches, {"sequential_targets": ["Linear"]})


@dataclass
class Modifier:
    """What from_modifiers reads of a modifier."""

    requires_calibration_data: bool
    sequential_targets: Any = None


def test_from_modifiers_picks_as_documented(caplog: pytest.LogCaptureFixture) -> None:
    data, free = Modifier(True), Modifier(False)
    assert type(CalibrationPipeline.from_modifiers([data])) is SequentialPipeline
    assert type(CalibrationPipeline.from_modifiers([free, data])) is SequentialPipeline
    assert type(CalibrationPipeline.from_modifiers([free])) is DataFreePipeline
    assert type(CalibrationPipeline.from_modifiers([])) is DataFreePipeline
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        assert type(CalibrationPipeline.from_modifiers([free], "independent")) is (
            IndependentPipeline
        )
        assert not caplog.records  # independent is never second-guessed
        chosen = CalibrationPipeline.from_modifiers([data], user="Layer_Sequential")
    assert type(chosen) is LayerSequentialPipeline
    assert "recommended to use `sequential`" in caplog.text
    assert type(CalibrationPipeline.from_modifiers([data], "basic")) is BasicPipeline
    assert type(CalibrationPipeline.from_modifiers([free], "data_free")) is DataFreePipeline
    with pytest.raises(BadInputError, match="sequantial"):
        CalibrationPipeline.from_modifiers([data], "sequantial")
    callbacks = CalibrationCallbacks()
    assert CalibrationPipeline.from_modifiers([data, callbacks]).callbacks == [callbacks]


def test_independent_pipeline_runs_each_callbacks_with_its_own_pipeline() -> None:
    model, batches = tiny_llama(layers=2), llama_batches(2)
    log: list[str] = []
    free = CalibrationCallbacks(
        sequential_epoch_end=lambda modules: log.append("free"), requires_calibration_data=False
    )
    data = CalibrationCallbacks(sequential_epoch_end=lambda modules: log.append("data"))
    data.register_hook(model.model.layers[0], lambda m, a: log.append("batch"))
    IndependentPipeline([free, data])(model, batches, None)
    first_data = min(log.index("data"), log.index("batch"))
    assert set(log[:first_data]) == {"free"} and "free" not in log[first_data:]
    assert log.count("batch") == 2  # the data step calibrated layer 0 on both batches


def modules_by_walk(model: torch.nn.Module, names: list[str]) -> set[torch.nn.Module]:
    """Match by hand: the path equals a name, a ``re:`` name matches from the path's start, or
    a plain name is the class or one of its bases."""
    import re

    found: set[torch.nn.Module] = set()

    def visit(path: str, module: torch.nn.Module) -> None:
        for name in names:
            if name.startswith("re:"):
                hit = re.match(name[3:], path) is not None
            else:
                hit = path == name or name in {c.__name__ for c in type(module).__mro__}
            if hit:
                found.add(module)
        for child_name, child in module._modules.items():
            if child is not None:
                visit(f"{path}.{child_name}" if path else child_name, child)

    visit("", model)
    return found


@pytest.mark.parametrize(
    "names",
    [
        ["LlamaDecoderLayer"],
        ["Linear"],
        ["LlamaDecoderLayer", "Linear"],
        ["re:model\\.layers\\.1\\."],
        ["lm_head", "model.norm"],
        ["Module"],
        ["NoSuchClass"],
    ],
)
def test_match_modules_agrees_with_a_walk(names: list[str]) -> None:
    model = tiny_llama(layers=2)
    assert match_modules(model, names) == modules_by_walk(model, names)


def test_get_sequential_targets_from_modifiers_arguments_or_model() -> None:
    model = tiny_llama(layers=2)
    assert get_sequential_targets([], model, None) == ["LlamaDecoderLayer"]
    assert get_sequential_targets([Modifier(True)], model, {"sequential_targets": "Linear"}) == [
        "Linear"
    ]
    assert get_sequential_targets([Modifier(True, ["LlamaMLP"])], model, None) == ["LlamaMLP"]
    with pytest.raises(BadInputError):
        get_sequential_targets([Modifier(True, "Linear")], model, {"sequential_targets": ["X"]})
    with pytest.raises(BadInputError):
        get_sequential_targets([Modifier(True, "A"), Modifier(True, "B")], model, None)


def test_dispatch_for_sequential_leaves_outputs_unchanged() -> None:
    model, batch = tiny_llama(layers=2), token_batch()
    with torch.no_grad():
        expected = model(**batch).logits
    assert dispatch_for_sequential(model) is model
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert onload_device(model) == main_device()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, expected, rtol=0, atol=0)


def test_dispatch_for_sequential_removes_accelerate_offloading() -> None:
    """accelerate's hooks move weights on every call; after dispatching, the weights stay on
    the CPU, no hook is left, and the outputs are what they were (accelerate is in the test
    extras)."""
    import accelerate

    model, batch = tiny_llama(layers=2), token_batch()
    with torch.no_grad():
        expected = model(**batch).logits
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    assert any(hasattr(m, "_hf_hook") for m in model.modules())
    dispatch_for_sequential(model)
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    assert all(p.device.type == "cpu" for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, expected, rtol=0, atol=0)


def test_llm_compressor_dataset_arguments_drive_the_pipeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """llm-compressor's own DatasetArguments object (where it is installed) is read without
    a warning, and its fields take effect: Linear targets and no error propagation."""
    dataset_arguments = pytest.importorskip("llmcompressor.args.dataset_arguments")
    model, batches = tiny_llama(layers=2), llama_batches(2)
    args = dataset_arguments.DatasetArguments(sequential_targets=["Linear"], propagate_error=False)
    paths = target_paths(model, "Linear")
    expected = eager_calls(model, paths, batches)
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        actual = pipeline_calls(SequentialPipeline, model, paths, batches, args, round_linears)
    assert not caplog.records
    assert_same_calls(actual, expected, paths, len(batches))  # inputs of the original model


def test_sequential_tracer_stops_at_targets_and_beside_them() -> None:
    model, batch = tiny_llama(layers=2), token_batch()
    targets = match_modules(model, ["LlamaDecoderLayer"])
    tracer = SequentialTracer(get_sequential_ancestors(model, targets), {model.lm_head})
    graph = fx.GraphModule(model, tracer.trace(model, dummy_inputs=batch))
    called = [n.target for n in graph.graph.nodes if n.op == "call_module"]
    assert {"model.layers.0", "model.layers.1", "model.embed_tokens", "lm_head"} <= set(called)
    assert not any(str(path).startswith("model.layers.0.") for path in called)
    with torch.no_grad():
        expected = model(**batch, use_cache=False).logits
        traced = graph(**batch)
    logits = traced["logits"] if isinstance(traced, dict) else traced.logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)

    class IntoFirstLayer(SequentialTracer):
        def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
            inside = module_qualified_name == "model.layers.0"
            return not inside and super().is_leaf_module(m, module_qualified_name)

    tracer = IntoFirstLayer(get_sequential_ancestors(model, targets))
    graph = fx.GraphModule(model, tracer.trace(model, dummy_inputs=batch))
    called = {n.target for n in graph.graph.nodes if n.op == "call_module"}
    assert "model.layers.0" not in called and "model.layers.0.mlp" in called
    with torch.no_grad():
        traced = graph(**batch)
    logits = traced["logits"] if isinstance(traced, dict) else traced.logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


@dataclass
class DatasetArguments:
    """The shape of llm-compressor's DatasetArguments, the fields a pipeline reads and two
    it does not."""

    dataset: str | None = "ultrachat"
    max_seq_length: int = 512
    sequential_targets: list[str] | None = field(default_factory=lambda: ["LlamaDecoderLayer"])
    propagate_error: bool = False
    sequential_targets_per_subgraph: int = 2


def test_dataset_arguments_as_object_or_mapping(caplog: pytest.LogCaptureFixture) -> None:
    from_object = pipeline_arguments(DatasetArguments())
    mapping = {
        "sequential_targets": ["LlamaDecoderLayer"],
        "propagate_error": False,
        "sequential_targets_per_subgraph": 2,
        "max_seq_length": 512,
    }
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        assert pipeline_arguments(mapping) == from_object
        assert not caplog.records  # every field was llm-compressor's
        typo = pipeline_arguments({**mapping, "sequential_target": "X", "propagate": True})
    assert typo == from_object
    (warning,) = caplog.records
    assert "propagate, sequential_target " in warning.getMessage()
    assert pipeline_arguments({"sequential_targets": "Linear"}).sequential_targets == ["Linear"]
    assert pipeline_arguments(None).tracing_ignore[1] == "create_causal_mask"
    with pytest.raises(BadInputError):
        pipeline_arguments({"sequential_targets_per_subgraph": 0})
