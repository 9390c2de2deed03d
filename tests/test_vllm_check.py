"""The vLLM serving check's own logic (``benchmarks/vllm_serving.py``), without vLLM.

vLLM itself runs in CI's serving step, where the tampered checkpoints must fail; these tests
pin down what the check decides from what vLLM says, so a change to it cannot quietly turn a
refusal into a pass.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from safetensors.torch import load_file, save_file

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_serving.py"


@pytest.fixture(scope="module")
def serving():  # noqa: ANN201 - the benchmark module, loaded from its file
    spec = importlib.util.spec_from_file_location("vllm_serving", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_serving"] = module
    spec.loader.exec_module(module)
    return module


def test_reversed_packing_keeps_shapes_and_scrambles_every_group(serving) -> None:  # noqa: ANN001
    values = torch.randint(-8, 8, (4, 64), dtype=torch.int8)
    packed = pack_to_int32(values, 4)
    reversed_packed = serving.reverse_nibbles(packed)
    assert reversed_packed.shape == packed.shape and reversed_packed.dtype == torch.int32
    torch.testing.assert_close(serving.reverse_nibbles(reversed_packed), packed)
    unpacked = unpack_from_int32(reversed_packed, 4, torch.Size([4, 64]))
    expected = values.view(4, 8, 8).flip(-1).reshape(4, 64)  # each int32's eight reversed
    torch.testing.assert_close(unpacked, expected)


def test_a_renamed_tensor_is_the_only_change(serving, tmp_path: Path) -> None:  # noqa: ANN001
    source = tmp_path / "source"
    source.mkdir()
    tensors = {
        "a.weight_scale": torch.ones(2),
        "a.weight_packed": torch.zeros(2, dtype=torch.int32),
    }
    save_file(tensors, source / "model.safetensors")
    serving.tamper(source, tmp_path / "out", "rename")
    after = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(after) == ["a.weight_packed", "a.weight_scales"]


def test_what_counts_as_a_pass(serving) -> None:  # noqa: ANN001
    case, tampered = serving.CASES[1], serving.CASES[-1]
    assert serving.Row(case, verdict="agrees").passed
    assert serving.Row(case, verdict="no kernel here; reference agrees").passed
    assert not serving.Row(case, verdict="DISAGREES").passed
    assert not serving.Row(case, verdict="REFUSED").passed
    assert serving.Row(tampered, verdict="DISAGREES").passed  # expected to fail, and did
    assert not serving.Row(tampered, verdict="agrees").passed  # the check missed it


def test_reasons_are_read_from_the_worker_log(serving) -> None:  # noqa: ANN001
    log = (
        "(EngineCore pid=1) ERROR [core.py:1] EngineCore failed to start.\n"
        "(EngineCore pid=1) ERROR [core.py:2] ValueError: Failed to find a kernel that can "
        "implement the WNA16 linear layer. Reasons:\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert serving.no_kernel_reason(log).startswith("ValueError: Failed to find a kernel")
    assert serving.root_cause(log, "fallback").startswith("ValueError: Failed to find a kernel")
    refusal = "ERROR [x.py:3] ValueError: Following weights were not initialized: ['a']\n"
    assert serving.no_kernel_reason(refusal) is None
    assert serving.root_cause(refusal, "fallback").startswith("ValueError: Following weights")
