"""The three data pipelines show every target the same inputs; only sequential propagates."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from llmc_trace import trace_subgraphs
from llmc_trace.pipelines.basic import run_basic
from llmc_trace.pipelines.cache import IntermediatesCache, slab_host_bytes
from llmc_trace.pipelines.layer_sequential import check_layer_sequential, run_layer_sequential
from llmc_trace.pipelines.sequential import run_sequential
from tests.conftest import tiny_llama, token_batch


class Recorder:
    """Records the hidden states each target receives; optionally perturbs it after calibration."""

    def __init__(self, targets: list[torch.nn.Module], perturb: bool = False) -> None:
        self.targets = {id(t): i for i, t in enumerate(targets)}
        self.seen: dict[int, list[torch.Tensor]] = {}
        self.perturb = perturb
        self.handles: list = []

    def wants(self, modules) -> bool:
        return any(id(m) in self.targets for _, m in modules)

    def passes(self, modules):  # type: ignore[no-untyped-def]
        return [modules]

    def on_subgraph_start(self, index, modules) -> None:
        for _, module in modules:
            if id(module) in self.targets:
                hook = self._record(self.targets[id(module)])
                self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))

    def _record(self, key: int):  # type: ignore[no-untyped-def]
        def record(module, args, kwargs) -> None:  # type: ignore[no-untyped-def]
            self.seen.setdefault(key, []).append(args[0].clone())

        return record

    def on_calibrated(self, index, modules) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        if not self.perturb:
            return
        for _, module in modules:
            if id(module) in self.targets:
                with torch.no_grad():
                    for p in module.parameters():
                        p.mul_(1.5)

    def on_batch(self, batch) -> None:
        return None

    def on_subgraph_end(self, index, modules) -> None:
        return None


def setup(seed: int = 0):
    model = tiny_llama(layers=4, seed=seed)
    batches = [token_batch(2, 12, seed=s) for s in range(3)]
    targets = list(model.model.layers)
    return model, batches, targets


def run_pipeline(
    kind: str,
    model: torch.nn.Module,
    batches: list[dict],
    targets: list[torch.nn.Module],
    recorder: Recorder,
    target_classes: list[str],
    propagate: bool = True,
) -> None:
    """Run the pipeline ``kind`` over ``batches`` with ``recorder`` listening on ``targets``."""
    if kind == "basic":
        run_basic(model, targets, batches, recorder, forward_kwargs={"use_cache": False})
    elif kind == "layer_sequential":
        run_layer_sequential(
            model,
            targets,
            batches,
            recorder,
            propagate_error=propagate,
            forward_kwargs={"use_cache": False},
        )
    else:
        subgraphs = trace_subgraphs(model, batches[0], target_classes)
        run_sequential(model, subgraphs, batches, recorder, propagate_error=propagate)


def run(kind: str, perturb: bool = False, propagate: bool = True) -> dict[int, list[torch.Tensor]]:
    model, batches, targets = setup()
    recorder = Recorder(targets, perturb)
    run_pipeline(kind, model, batches, targets, recorder, ["LlamaDecoderLayer"], propagate)
    return recorder.seen


def test_all_pipelines_feed_identical_inputs() -> None:
    reference = run("basic")
    for kind in ("layer_sequential", "sequential"):
        seen = run(kind, propagate=False)
        assert sorted(seen) == sorted(reference) == [0, 1, 2, 3]
        for key in reference:
            for got, want in zip(seen[key], reference[key], strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["sequential", "layer_sequential"])
def test_propagation_carries_perturbed_outputs(kind: str) -> None:
    clean = run("basic")
    basic_perturbed = run("basic", perturb=True)
    propagated = run(kind, perturb=True)
    not_propagated = run(kind, perturb=True, propagate=False)
    torch.testing.assert_close(basic_perturbed[3][0], clean[3][0])  # basic never propagates
    torch.testing.assert_close(not_propagated[3][0], clean[3][0])
    assert not torch.allclose(propagated[3][0], clean[3][0])
    torch.testing.assert_close(propagated[0][0], clean[0][0])  # the first target sees raw inputs


def test_cache_drops_consumed_names_and_shares_invariant_values() -> None:
    model, batches, _ = setup()
    subgraphs = trace_subgraphs(model, batches[0], ["LlamaDecoderLayer"])
    same_shape = [token_batch(2, 12, seed=s) for s in range(3)]
    for b in same_shape:
        b["attention_mask"] = torch.ones_like(b["attention_mask"])
    stats = run_sequential(model, subgraphs, same_shape, Recorder(list(model.model.layers)))
    assert "model_rotary_emb" in stats.shared_names and "create_causal_mask" in stats.shared_names
    assert "model_embed_tokens" not in stats.shared_names
    cache = IntermediatesCache.from_batches([dict(b) for b in same_shape], torch.device("cpu"))
    for index in range(len(cache)):
        cache.replace(index, ["input_ids"], {})
    assert "input_ids" not in cache.names()


def test_a_step_s_outputs_take_over_the_rows_its_consumed_inputs_free() -> None:
    """Hidden states replaced batch by batch stay in one slab: the cache never holds two sets."""
    inputs = [{"hidden": torch.full((4, 8), float(i))} for i in range(3)]
    cache = IntermediatesCache.from_batches(inputs, torch.device("cpu"))
    held = cache.size_bytes()
    outputs = [torch.full((4, 8), 10.0 + i) for i in range(3)]
    for index, output in enumerate(outputs):
        cache.replace(index, ["hidden"], {"next_hidden": output})
        assert cache.size_bytes() == held
    assert cache.names() == {"next_hidden"}
    for index, output in enumerate(outputs):
        fetched = cache.fetch(index, ["next_hidden"], torch.device("cpu"))["next_hidden"]
        torch.testing.assert_close(fetched, output)


@pytest.mark.parametrize(("batches", "pinned"), [(4, True), (3, False), (15, True), (9, False)])
def test_a_gpu_hosts_slab_is_pinned_where_its_power_of_two_block_wastes_little(
    monkeypatch: pytest.MonkeyPatch, batches: int, pinned: bool
) -> None:
    """torch's pinned-memory allocator holds the next power of two of each block. Rows of 128
    bytes: 4 fill a 512-byte block and 15 (1,920 bytes) waste 7 % of a 2 KiB one, so they are
    pinned; 3 (384) would waste a third and 9 (1,152) 78 %, so they stay pageable. The plan
    reads the same rule (``slab_host_bytes``)."""
    from llmc_trace.pipelines import cache as cache_module

    asked: list[bool] = []
    empty = torch.empty

    def recording_empty(*args, pin_memory: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(pin_memory)
        return empty(*args, **kwargs)  # this CPU build of torch pins nothing

    monkeypatch.setattr(cache_module.torch, "empty", recording_empty)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    inputs = [{"hidden": torch.full((4, 8), float(i))} for i in range(batches)]
    cache = IntermediatesCache.from_batches(inputs, torch.device("cpu"), for_gpu=True)
    assert asked == [pinned]  # one slab, made when the second batch differs from the first
    nbytes = batches * 128
    held = slab_host_bytes(nbytes, for_gpu=True)
    assert held == (1 << (nbytes - 1).bit_length() if pinned else nbytes)
    assert slab_host_bytes(nbytes, for_gpu=False) == nbytes
    for index in range(batches):
        fetched = cache.fetch(index, ["hidden"], torch.device("cpu"))["hidden"]
        assert torch.equal(fetched, inputs[index]["hidden"])


@dataclass(frozen=True)
class _Carried:
    """A value a model passes between layers inside a dataclass of its own."""

    hidden: torch.Tensor
    note: str


def test_cache_offloads_and_fetches_the_tensors_inside_dataclass_values() -> None:
    value = _Carried(torch.ones(2, 3), "kept")
    cache = IntermediatesCache.from_batches([{"carried": value}], torch.device("meta"))
    stored = cache.batches[0]["carried"]
    assert isinstance(stored, _Carried) and stored.note == "kept"
    assert stored.hidden.device.type == "meta"  # offloaded, not left where it was
    assert value.hidden.device.type == "cpu"  # the caller's value is untouched
    fetched = cache.fetch(0, ["carried"], torch.device("meta"))["carried"]
    assert fetched is stored  # already there: nothing copied


def test_layer_sequential_check_accepts_llama() -> None:
    model, batches, targets = setup()
    assert check_layer_sequential(model, targets, batches[0], {"use_cache": False}) == []


def _reference_or_twin(name: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from llmc_trace.models.build import build_twin
    from llmc_trace.models.source import resolve_model
    from tests.conftest import require_refmodel

    if name == "refmodel":
        return AutoModelForCausalLM.from_pretrained(require_refmodel(), dtype=torch.float32).eval()
    return build_twin(resolve_model(name))


@pytest.mark.parametrize(
    "name", ["refmodel", "Qwen/Qwen3-30B-A3B", "mistralai/Mistral-7B-v0.1", "google/gemma-2b-it"]
)
def test_pipelines_agree_on_real_architectures(name: str) -> None:
    """Same target inputs from basic, layer_sequential and sequential (no propagation)."""
    from llmc_trace.tracing.targets import default_target_patterns

    model = _reference_or_twin(name)
    vocab = model.config.vocab_size
    batches = [token_batch(1, 24, vocab=vocab, seed=s) for s in range(2)]
    pattern = default_target_patterns(model, list(model.named_modules()))
    targets = [m for m in model.modules() if type(m).__name__ in pattern]
    seen = {}
    for kind in ("basic", "layer_sequential", "sequential"):
        recorder = Recorder(targets)
        run_pipeline(kind, model, batches, targets, recorder, pattern, propagate=False)
        seen[kind] = recorder.seen
    assert len(seen["basic"]) == len(targets)
    for kind in ("layer_sequential", "sequential"):
        for key, tensors in seen["basic"].items():
            for got, want in zip(seen[kind][key], tensors, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("propagate", [True, False])
def test_sequential_cache_holds_no_consumed_name_and_one_set_of_hidden_states(
    monkeypatch: pytest.MonkeyPatch, propagate: bool
) -> None:
    """Sampled at every batch: no name a finished subgraph consumed is still cached, and the
    cache never holds more than one set of hidden states (plus one batch and shared values)."""
    model, batches, targets = setup()
    subgraphs = trace_subgraphs(model, batches[0], ["LlamaDecoderLayer"])
    caches: list[IntermediatesCache] = []
    original = IntermediatesCache.from_batches.__func__  # type: ignore[attr-defined]

    def capture(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        caches.append(original(cls, *args, **kwargs))
        return caches[-1]

    monkeypatch.setattr(IntermediatesCache, "from_batches", classmethod(capture))
    hidden = 2 * 12 * model.config.hidden_size * 4  # one batch's hidden states, float32
    sizes: list[int] = []
    finished: set[str] = set()

    def check(label: str, done: int, total: int) -> None:
        position = int(label.split()[1].split("/")[0]) - 1
        if done == 0:
            finished.update(n for s in subgraphs[:position] for n in s.consumed_names)
        cached = caches[0].names()
        assert not cached & finished, f"{label}: consumed names still cached"
        sizes.append(caches[0].size_bytes())

    stats = run_sequential(
        model,
        subgraphs,
        batches,
        Recorder(targets, perturb=True),
        propagate_error=propagate,
        progress=check,
    )
    shared = sum(
        v.numel() * v.element_size()
        for name in stats.shared_names
        for v in [caches[0].batches[0].get(name)]
        if isinstance(v, torch.Tensor)
    )
    assert sizes and max(sizes) <= len(batches) * hidden + hidden + shared + 2 * 12 * 8 * 3
    # calibration + propagation for every target but the last, which nothing reads after
    assert stats.passes == (
        [1] + [2] * (len(subgraphs) - 2) + [1] if propagate else [1] * len(subgraphs)
    )


def test_layer_sequential_stores_arguments_equal_for_all_batches_once() -> None:
    from llmc_trace.pipelines.layer_sequential import TargetCall, share_with

    mask = torch.ones(1, 1, 4, 4)
    first = TargetCall((torch.randn(1, 4, 8), mask), {"position_embeddings": (mask + 1, mask)})
    second = TargetCall(
        (torch.randn(1, 4, 8), mask.clone()), {"position_embeddings": (mask + 1, mask.clone())}
    )
    shared = share_with(second, first)
    assert shared.args[0] is second.args[0]  # hidden states are never shared
    assert shared.args[1] is first.args[1]
    assert shared.kwargs["position_embeddings"] is first.kwargs["position_embeddings"]
    different = TargetCall((torch.randn(1, 4, 8), mask * 2), {})
    assert share_with(different, first).args[1] is different.args[1]
