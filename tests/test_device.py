"""Device placement: ``core.device.place`` and the residencies that move weights through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmc_trace.core.device import HOST, place, resolve
from tests.float32_cpu import HALF_PRECISION_PROBES
from llmc_trace.models.build import build_skeleton
from llmc_trace.models.source import resolve_model
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.pipelines.residency import InMemory, Streamed, compute_dtype

META = torch.device("meta")


def test_place_returns_the_tensor_itself_when_it_is_there_already() -> None:
    weight = torch.randn(4, 3)
    assert place(weight, HOST) is weight
    assert place(weight, HOST, torch.float32) is weight
    cast = place(weight, HOST, torch.bfloat16)
    assert cast.dtype == torch.bfloat16 and torch.equal(cast, weight.bfloat16())
    ids = torch.arange(3)
    assert place(ids, HOST, torch.bfloat16) is ids  # integers keep their dtype
    assert place(weight, META).device == META


def test_devices_other_than_unindexed_cuda_resolve_to_themselves() -> None:
    for device in (HOST, META, torch.device("cuda", 1)):
        assert resolve(device) == device


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_tensor_on_the_current_gpu_is_there_for_an_unindexed_cuda_device() -> None:
    """``torch.device("cuda")`` never equals a tensor's ``cuda:0``; resolved, it does, and a
    weight already on the GPU in the compute dtype stays where it is."""
    cuda = torch.device("cuda")
    on_gpu = place(torch.randn(4, 3), cuda)
    assert on_gpu.device == resolve(cuda) and place(on_gpu, cuda) is on_gpu
    layer = torch.nn.Linear(3, 4)
    residency = InMemory(HOST, torch.bfloat16)
    residency.enter([layer], cuda)
    moved = layer.weight.data_ptr()
    residency.enter([layer], cuda)
    assert layer.weight.data_ptr() == moved and layer.weight.dtype == torch.bfloat16
    assert layer.weight.device == resolve(cuda)
    residency.leave([layer])
    assert layer.weight.device == HOST and layer.weight.dtype == torch.float32


def test_in_memory_weights_go_to_the_device_in_the_compute_dtype_and_come_back() -> None:
    layer = torch.nn.Linear(3, 4).bfloat16()
    parameter, original = layer.weight, layer.weight.detach().clone()
    residency = InMemory(HOST, torch.float32)
    residency.enter([layer], HOST)
    assert layer.weight.dtype == torch.float32 and layer.weight is parameter
    residency.leave([layer])
    assert layer.weight.dtype == torch.bfloat16 and torch.equal(layer.weight, original)


def test_a_streamed_group_sits_wholly_on_the_device_it_enters(
    saved_llama: tuple[Path, Path],
) -> None:
    """Every parameter and buffer of an entered group is on the execution device (``meta``
    stands for any device that is not the host: a weight read or left on the CPU would show),
    nothing outside the group is read, and leaving exports the group's weights as they are on
    that device (the checkpoint writer brings them to the host)."""
    folder, _ = saved_llama
    store = WeightStore(folder)
    model = build_skeleton(resolve_model(str(folder)), store)
    exported: dict[str, torch.device] = {}
    residency = Streamed(model, store, lambda name, t: exported.setdefault(name, t.device))
    first = model.model.layers[0]
    rotary = [model.model.rotary_emb]  # its tables are buffers; a meta one cannot come back
    residency.prepare([rotary, list(first.modules()), list(model.model.layers[1].modules())])
    residency.enter(rotary, META)
    residency.enter(list(first.modules()), META)
    tensors = [*first.parameters(), model.model.rotary_emb.inv_freq]
    assert len(tensors) == 10 and {t.device for t in tensors} == {META}
    assert all(t.is_meta for t in model.model.layers[1].parameters())  # not read yet
    assert model.model.embed_tokens.weight.is_meta
    residency.leave(list(first.modules()))
    assert set(exported) == {f"model.layers.0.{n}" for n, _ in first.named_parameters()}
    assert set(exported.values()) == {META}


@pytest.mark.parametrize("native", [True, False])
def test_a_cpu_computes_in_half_precision_only_where_it_multiplies_it_natively(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """torch's probes of the CPU decide: bfloat16 stays bfloat16 where AVX512-BF16 or AMX is
    reported, float16 where AVX512-FP16 or AMX-FP16 is; else float32. A GPU keeps the
    checkpoint's dtype, and float32 is float32 everywhere."""
    for probe in HALF_PRECISION_PROBES:
        monkeypatch.setattr(torch.cpu, probe, lambda: native, raising=False)
    cpu = torch.device("cpu")
    for half in (torch.bfloat16, torch.float16):
        assert compute_dtype(half, cpu) == (half if native else torch.float32)
        assert compute_dtype(half, torch.device("cuda")) == half
    assert compute_dtype(torch.float32, cpu) == torch.float32
