"""Float grids (FP8, NVFP4, MX): compressed-tensors' own arithmetic is the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize
from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake_quantize

from llmc_trace.algorithms import gptq, resolve_scheme, rtn, sparsegpt
from llmc_trace.algorithms.formats import ct_weight_args

FP4_VALUES = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}


def _weight(dtype: torch.dtype = torch.float32, rows: int = 256, cols: int = 512) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(rows, cols, generator=generator) * 0.02
    W[3, 17] = 0.3  # an outlier, so per-group scales differ from per-tensor ones
    return W.to(dtype)


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "FP8", "FP8_BLOCK", "MXFP4A16", "MXFP8A16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rtn_is_compressed_tensors_fake_quantize(preset: str, dtype: torch.dtype) -> None:
    """With our scales, compressed-tensors' own quantize-dequantize gives our weight."""
    args = resolve_scheme(preset).weights
    W = _weight(dtype)
    ours = rtn(W, args)
    theirs = ct_fake_quantize(W.float(), ours.scale.float(), None, ct_weight_args(args))
    assert torch.equal(ours.weight, theirs.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_decompresses_as_compressed_tensors_does(dtype: torch.dtype) -> None:
    """NVFP4: FP4 values with FP8 group scales under a float32 global scale, decompressed by
    compressed-tensors (values unpacked to bfloat16, as its compressor hands them over)."""
    args = resolve_scheme("NVFP4A16").weights
    W = _weight(dtype)
    ours = rtn(W, args)
    assert ours.global_scale is not None and ours.global_scale.dtype == torch.float32
    assert set(ours.int_weight.float().abs().unique().tolist()) <= FP4_VALUES
    stored = ours.scale.to(torch.float8_e4m3fn)
    assert torch.equal(stored.to(dtype), ours.scale)  # the scales are FP8 values exactly
    theirs = ct_dequantize(
        ours.int_weight.to(torch.bfloat16),
        stored.to(torch.bfloat16),
        args=ct_weight_args(args),
        global_scale=ours.global_scale,
        dtype=torch.bfloat16,
    )
    assert torch.equal(ours.weight, theirs.to(dtype))
    # the global scale puts the largest group's scale at the top of FP8's range
    assert 400 < ours.scale.float().max() <= 448


def test_mx_scales_are_powers_of_two_per_32() -> None:
    quantized = rtn(_weight(), resolve_scheme("MXFP4A16").weights)
    assert quantized.scale.shape == (256, 512 // 32)
    exponents = torch.log2(quantized.scale.float())
    assert torch.equal(exponents, exponents.round())


def test_fp8_block_scales_one_per_128_square() -> None:
    quantized = rtn(_weight(), resolve_scheme("FP8_BLOCK").weights)
    W = _weight()
    absmax = W.abs().reshape(2, 128, 4, 128).amax(dim=(1, 3))
    assert torch.equal(quantized.scale, absmax / 448)
    assert quantized.scale.argmax().item() == 0  # the outlier's block


@pytest.mark.parametrize("preset", ["FP8_BLOCK", "NVFP4A16", "MXFP4A16"])
def test_gptq_beats_round_to_nearest_on_float_grids(preset: str) -> None:
    """GPTQ on a float grid: each column rounded to the format's nearest value, its error
    spread by the Hessian; the layer's output error falls well below round-to-nearest's."""
    args = resolve_scheme(preset).weights
    W = _weight()
    generator = torch.Generator().manual_seed(1)
    X = torch.randn(2048, 512, generator=generator) @ torch.randn(512, 512, generator=generator)
    H = 2 * X.T @ X / X.shape[0]
    result = gptq(W, H.clone(), args, baseline=True)
    quantized = result.quantized
    assert quantized.weight is not None
    assert torch.equal(quantized.dequantized(), quantized.weight)

    def output_error(Q: torch.Tensor) -> float:
        return ((W - Q) @ X.T).pow(2).sum().item()

    baseline = rtn(W, args).weight
    assert output_error(quantized.weight) < 0.7 * output_error(baseline)
    assert result.baseline_loss is not None and result.loss < 0.7 * result.baseline_loss


def test_sparsegpt_prunes_two_of_four_onto_nvfp4() -> None:
    args = dataclasses.replace(resolve_scheme("NVFP4A16").weights, actorder=None)
    W = _weight(rows=64, cols=256)
    X = torch.randn(1024, 256, generator=torch.Generator().manual_seed(2))
    result = sparsegpt(W, 2 * X.T @ X / 1024, (2, 4), quantize=args)
    quantized = result.quantized
    assert quantized is not None and quantized.weight is not None
    assert torch.equal(quantized.dequantized(), quantized.weight)
    kept = (quantized.weight != 0).reshape(64, -1, 4).sum(-1)
    assert kept.max() <= 2
