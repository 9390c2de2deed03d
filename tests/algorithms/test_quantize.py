"""Quantization grids: our qparams and rounding equal compressed-tensors' own maths."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.quantization import QuantizationArgs as CtArgs
from compressed_tensors.quantization.lifecycle.forward import fake_quantize as ct_fake_quantize
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
from compressed_tensors.quantization.utils import calculate_qparams

from llmc_trace.algorithms import (
    QuantizationArgs,
    SchemeError,
    compute_qparams,
    dequantize,
    fake_quantize,
    quantize_to_int,
    rtn,
)
from llmc_trace.algorithms.quantize import MSE_NORM

ARGS = [
    QuantizationArgs(num_bits=4, symmetric=True, strategy="group", group_size=128),
    QuantizationArgs(num_bits=4, symmetric=False, strategy="group", group_size=32),
    QuantizationArgs(num_bits=8, symmetric=True, strategy="channel", group_size=None),
    QuantizationArgs(num_bits=3, symmetric=False, strategy="channel", group_size=None),
    QuantizationArgs(num_bits=4, symmetric=True, strategy="tensor", group_size=None),
    QuantizationArgs(num_bits=2, symmetric=False, strategy="tensor", group_size=None),
]


def _weight(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(512, 256, generator=generator) * 0.02
    W[3, 17] = 0.3  # an outlier weight
    W[5] = W[5].abs()  # an all-positive row: min clamps to 0
    W[7, :128] = 0  # an all-zero group: zero scale becomes eps
    return W.to(dtype)


def _ct_args(args: QuantizationArgs) -> CtArgs:
    return CtArgs(
        num_bits=args.num_bits,
        type="int",
        symmetric=args.symmetric,
        strategy=args.strategy,
        group_size=args.group_size,
    )


def _ct_qparams(W: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' `calculate_qparams` on the min and max of each scale's values."""
    if args.strategy == "tensor":
        rows = W.reshape(1, -1)
    elif args.strategy == "channel":
        rows = W
    else:
        rows = W.reshape(W.shape[0], -1, args.group_size)
    scale, zero_point = calculate_qparams(rows.amin(-1), rows.amax(-1), _ct_args(args))
    shape = (1,) if args.strategy == "tensor" else (W.shape[0], -1)
    return scale.reshape(shape), zero_point.reshape(shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("args", ARGS, ids=lambda a: f"{a.num_bits}b-{a.strategy}-{a.symmetric}")
def test_qparams_equal_compressed_tensors(args: QuantizationArgs, dtype: torch.dtype) -> None:
    W = _weight(dtype)
    scale, zero_point = compute_qparams(W, args)
    ct_scale, ct_zero_point = _ct_qparams(W, args)
    assert scale.dtype == dtype and zero_point.dtype == torch.int8
    torch.testing.assert_close(scale, ct_scale, rtol=0, atol=0)
    torch.testing.assert_close(zero_point.float(), ct_zero_point.float(), rtol=0, atol=0)


@pytest.mark.parametrize("args", ARGS, ids=lambda a: f"{a.num_bits}b-{a.strategy}-{a.symmetric}")
def test_rounding_equals_compressed_tensors(args: QuantizationArgs) -> None:
    W = _weight()
    scale, zero_point = compute_qparams(W, args)
    ct_zp = zero_point.to(W.dtype)
    ct_ints = ct_quantize(W, scale, ct_zp, _ct_args(args), dtype=torch.int8)
    assert torch.equal(quantize_to_int(W, scale, zero_point, args), ct_ints)
    ct_fake = ct_fake_quantize(W, scale, ct_zp, _ct_args(args))
    torch.testing.assert_close(fake_quantize(W, scale, zero_point, args), ct_fake, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("args", ARGS, ids=lambda a: f"{a.num_bits}b-{a.strategy}-{a.symmetric}")
def test_rtn_weights_lie_on_their_grid(args: QuantizationArgs, dtype: torch.dtype) -> None:
    W = _weight(dtype)
    result = rtn(W, args)
    ints = result.int_weight
    assert ints.dtype == torch.int8 and args.qmin <= ints.min() and ints.max() <= args.qmax
    assert result.weight.dtype == dtype
    # Invariant: the stored integers dequantize exactly to the weight ...
    assert torch.equal(
        dequantize(ints, result.scale, result.zero_point, args, dtype=dtype), result.weight
    )
    # ... and the weight is a fixed point of rounding: it lies on its grid.
    assert torch.equal(quantize_to_int(result.weight, result.scale, result.zero_point, args), ints)
    assert (result.weight[7, :128] == 0).all() or args.strategy != "group"


def test_mse_observer_never_loses_to_minmax() -> None:
    W = _weight()
    minmax = QuantizationArgs(num_bits=3, strategy="group", group_size=32)
    mse = QuantizationArgs(num_bits=3, strategy="group", group_size=32, observer="mse")

    def row_error(args: QuantizationArgs) -> torch.Tensor:
        groups = (W - rtn(W, args).weight).reshape(-1, 32)
        return groups.abs().pow(MSE_NORM).sum(dim=1)

    assert (row_error(mse) <= row_error(minmax)).all()
    assert row_error(mse).sum() < 0.95 * row_error(minmax).sum()


def test_group_size_must_divide_the_input_width() -> None:
    with pytest.raises(SchemeError) as info:
        compute_qparams(torch.randn(4, 100), QuantizationArgs(group_size=64))
    assert "group_size" in str(info.value) and info.value.hint


def test_a_compressor_keeps_integers_only_and_the_module_the_dense_weight() -> None:
    """The checkpoint needs the grid values; a dense copy per layer would double host memory."""
    from llmc_trace.algorithms import W4A16
    from llmc_trace.calibrate.compressor import LayerCompressor
    from llmc_trace.pipelines.basic import run_data_free
    from tests.conftest import tiny_llama

    model = tiny_llama(layers=1, hidden=128)
    compressor = LayerCompressor("rtn", W4A16)
    targets = [m for n, m in model.named_modules() if compressor.is_target(n, m)]
    run_data_free(model, targets, compressor)
    assert len(compressor.quantized) == 7
    for name, kept in compressor.quantized.items():
        assert kept.weight is None and kept.int_weight.dtype == torch.int8
        assert torch.equal(kept.dequantized(), model.get_submodule(name).weight.data)
