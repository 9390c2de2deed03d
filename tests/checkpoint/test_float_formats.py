"""Checkpoints of the float presets (FP8, NVFP4, MX) and of integer weights with activations:
the tensors compressed-tensors' own compressors write, and transformers reloads them to our
weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.quantization import preset_name_to_scheme
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

from llmc_trace.algorithms import resolve_scheme, rtn
from llmc_trace.checkpoint.layout import format_of, module_tensor_specs, module_tensors
from llmc_trace.checkpoint.writer import save_compressed
from llmc_trace.core.sizes import TensorSpec

FAMILIES = {
    "FP8_DYNAMIC": "float-quantized",
    "FP8_BLOCK": "float-quantized",
    "NVFP4A16": "nvfp4-pack-quantized",
    "MXFP4A16": "mxfp4-pack-quantized",
    "MXFP6A16": "mxfp6-pack-quantized",
    "MXFP8A16": "mxfp8-quantized",
    "W4A8": "int-quantized",
    "W4AFP8": "int-quantized",
}


@pytest.mark.parametrize("preset", FAMILIES)
def test_module_tensors_equal_compressed_tensors_compressor(preset: str) -> None:
    """Our tensors for one layer are those compressed-tensors' compressor for the format
    writes from our dequantized weight and scales (float32, where its re-quantization of our
    weight is exact)."""
    scheme = resolve_scheme(preset)
    assert format_of(scheme) == FAMILIES[preset]
    W = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)) * 0.02
    quantized = rtn(W, scheme.weights)
    ours = module_tensors("layer", quantized, scheme)

    theirs_scheme = preset_name_to_scheme(preset, ["Linear"])
    compressor = BaseCompressor.get_value_from_registry(FAMILIES[preset])
    state = {"weight": quantized.weight, "weight_scale": quantized.scale}
    if quantized.global_scale is not None:
        state["weight_global_scale"] = quantized.global_scale
    theirs = compressor.compress(state, theirs_scheme)

    assert sorted(ours) == sorted(f"layer.{name}" for name in theirs)
    for name, tensor in theirs.items():
        assert ours[f"layer.{name}"].dtype == tensor.dtype, name
        assert torch.equal(ours[f"layer.{name}"], tensor), name
    planned = module_tensor_specs("layer", (256, 512), scheme, torch.float32)
    assert planned == {name: TensorSpec(t.dtype, tuple(t.shape)) for name, t in ours.items()}


def _tiny_llama() -> LlamaForCausalLM:
    """Widths 256 and 512, key/value projections 128 rows: every preset's groups and blocks."""
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, dtype=torch.bfloat16).eval()


@pytest.mark.parametrize("preset", FAMILIES)
def test_checkpoint_reloads_to_our_weights(preset: str, tmp_path: Path) -> None:
    scheme = resolve_scheme(preset)
    model = _tiny_llama()
    quantized = {
        name: rtn(module.weight.data, scheme.weights)
        for name, module in model.named_modules()
        if scheme.is_target(name, module)
    }
    save_compressed(model, tmp_path / "checkpoint", quantized, [scheme])
    for dequantize in (True, False):  # decompressed while loading, or on the first forward
        options = {"quantization_config": CompressedTensorsConfig(dequantize=True)}
        reloaded = AutoModelForCausalLM.from_pretrained(
            tmp_path / "checkpoint", **(options if dequantize else {})
        )
        reloaded(torch.zeros(1, 4, dtype=torch.long))
        for name, q in quantized.items():
            assert torch.equal(reloaded.get_submodule(name).weight, q.weight), (dequantize, name)
