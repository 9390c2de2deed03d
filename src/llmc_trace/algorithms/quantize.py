"""Map weights to their grid and back, with compressed-tensors' exact arithmetic.

Integer grids are computed here; float grids (FP8, FP4, the MX formats) take their scales and
rounding rule from compressed-tensors through :mod:`llmc_trace.algorithms.formats`, and
everything else (strategies, broadcasting, the sweep) is shared. For integers:

The maths is the one compressed-tensors applies when it reads a checkpoint
(`calculate_qparams`, `quantize`, `dequantize`): the clipping range always contains 0 (min
clamped to <= 0, max to >= 0); symmetric scale = absmax / ((qmax - qmin) / 2), so 4 bits use
absmax / 7.5 and the grid [-8, 7]; asymmetric scale = (max - min) / (qmax - qmin) with zero
point round(qmin - min / scale) clamped to the grid; a zero scale becomes the scale dtype's eps;
q = clamp(round(w / scale + zp), qmin, qmax) with round half to even; w = (q - zp) * scale.

Scales and zero points are computed in the dtype the scale is stored in (the model's), as
compressed-tensors computes them in the observed weight's dtype; rounding then runs in float32
with those stored scales, so the stored integers and scales reproduce our dequantized weights
bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from llmc_trace.errors import SchemeError
from llmc_trace.algorithms.formats import (
    CODE_DTYPE,
    effective_scale,
    float_qparams,
    tensor_global_scale,
    round_to_float_grid,
)
from llmc_trace.algorithms.scheme import QuantizationArgs

MSE_GRID = 100
MSE_MAXSHRINK = 0.2
MSE_NORM = 2.4
"""MSE observer search: shrink the range by 1 - i/MSE_GRID for i < MSE_MAXSHRINK * MSE_GRID and
keep, per row, the range with the smallest sum |w - q|^MSE_NORM. These are the constants of
GPTQ's `quant.py` and llm-compressor's MSE observer; unlike the latter there is no early stop
(patience), so all 20 shrink factors are tried and the result does not depend on the order."""


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight on its integer grid, with everything needed to store it or to reproduce it.

    Invariant: `weight == dequantize(int_weight, scale, zero_point, args, g_idx, weight.dtype,
    global_scale)` exactly, so a checkpoint holding `int_weight`, `scale` and `zero_point`
    loads as `weight`. On a float grid `int_weight` holds the format's values (`formats.
    CODE_DTYPE`), the zero points are 0, and NVFP4 adds its float32 `global_scale`.
    `weight` is `None` in what a compressor keeps for the checkpoint (:meth:`integers_only`):
    the dense copy lives in the module, and a second one per layer would cost a model's worth
    of host memory on a GPU run.
    """

    weight: torch.Tensor | None  # (out, in) dequantized, in the dtype of the weight it came from
    int_weight: torch.Tensor  # (out, in) int8 in [args.qmin, args.qmax]; float grids: values
    scale: torch.Tensor  # (out, groups), (out, 1) channel, (1,) tensor, (out/bh, in/bw) block
    zero_point: torch.Tensor  # int8, same shape as scale; all zeros when symmetric
    args: QuantizationArgs
    g_idx: torch.Tensor | None = None  # (in,) int32 group of each input column; actorder "group"
    global_scale: torch.Tensor | None = None  # (1,) float32, NVFP4's per-tensor scale

    def integers_only(self, device: torch.device | str = "cpu") -> QuantizedWeight:
        """What a checkpoint needs (integers, scales, zero points, group map) on `device`."""

        def moved(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device)

        return QuantizedWeight(
            None,
            self.int_weight.to(device),
            self.scale.to(device),
            self.zero_point.to(device),
            self.args,
            moved(self.g_idx),
            moved(self.global_scale),
        )

    def dequantized(self) -> torch.Tensor:
        """The dense weight the integers stand for, in the scale's dtype (the model's)."""
        return dequantize(
            self.int_weight,
            self.scale,
            self.zero_point,
            self.args,
            self.g_idx,
            global_scale=self.global_scale,
        )


def code_dtype(args: QuantizationArgs) -> torch.dtype:
    """How a grid's chosen values are held: int8 integers, or a float format's values."""
    return CODE_DTYPE if args.is_float else torch.int8


def compute_qparams(
    W: torch.Tensor,
    args: QuantizationArgs,
    *,
    scale_dtype: torch.dtype | None = None,
    global_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(scale, zero_point)` for `W` (out, in), shaped as compressed-tensors stores them.

    `scale` is in `scale_dtype` (default: `W.dtype`, the checkpoint's dtype) and `zero_point`
    is int8. Group-wise scales need `in_features` to be a multiple of `group_size`, block-wise
    ones both widths multiples of the block's. `global_scale`: NVFP4's (`weight_global_scale`).
    """
    out_features, in_features = W.shape
    if args.strategy == "tensor":
        rows = W.reshape(1, -1)
    elif args.strategy == "channel":
        rows = W
    elif args.strategy == "block":
        (bh, bw), (ob, ib) = blocks(W.shape, args)
        rows = W.reshape(ob, bh, ib, bw).transpose(1, 2).reshape(ob * ib, bh * bw)
    else:
        rows = W.reshape(out_features * num_groups(in_features, args), -1)
    scale, zero_point = _row_qparams(rows.float(), args, scale_dtype or W.dtype, global_scale)
    if args.strategy == "tensor":
        return scale.reshape(1), zero_point.reshape(1)
    if args.strategy == "block":
        return scale.reshape(ob, ib), zero_point.reshape(ob, ib)
    return scale.reshape(out_features, -1), zero_point.reshape(out_features, -1)


def blocks(
    shape: tuple[int, ...] | torch.Size, args: QuantizationArgs
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The block structure (rows, columns) of a block-wise grid and how many blocks a weight
    of `shape` has each way; both widths must be multiples of the block's."""
    assert args.block_structure is not None  # guaranteed by QuantizationArgs
    (bh, bw), (rows, cols) = args.block_structure, shape
    if rows % bh or cols % bw:
        raise SchemeError(
            f"a weight of {rows} x {cols} does not divide into {bh} x {bw} blocks.",
            hint="ignore this module, or use a per-channel scheme such as FP8_DYNAMIC.",
        )
    return (bh, bw), (rows // bh, cols // bw)


def num_groups(in_features: int, args: QuantizationArgs) -> int:
    """Number of scales per row: in_features / group_size for groups, else 1."""
    if args.group_size is None:
        return 1
    if in_features % args.group_size:
        raise SchemeError(
            f"in_features={in_features} is not a multiple of group_size={args.group_size}.",
            hint="ignore this module, or choose a group size that divides its input width.",
        )
    return in_features // args.group_size


def _row_qparams(
    rows: torch.Tensor,
    args: QuantizationArgs,
    scale_dtype: torch.dtype,
    global_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of `rows` (R, C), by min-max or by the MSE search."""
    xmin = rows.amin(dim=1).clamp(max=0)
    xmax = rows.amax(dim=1).clamp(min=0)
    scale, zero_point = _qparams_from_range(xmin, xmax, args, scale_dtype, global_scale)
    if args.observer == "minmax":
        return scale, zero_point
    best_err = torch.full_like(xmin, torch.inf)
    for i in range(int(MSE_MAXSHRINK * MSE_GRID)):
        shrink = 1 - i / MSE_GRID
        candidate_scale, candidate_zp = _qparams_from_range(
            shrink * xmin, shrink * xmax, args, scale_dtype, global_scale
        )
        s = effective_scale(candidate_scale, global_scale)[:, None]
        z = candidate_zp.float()[:, None]
        err = ((round_to_grid(rows, s, z, args) - z) * s - rows).abs().pow(MSE_NORM).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        scale = torch.where(better, candidate_scale, scale)
        zero_point = torch.where(better, candidate_zp, zero_point)
    return scale, zero_point


def _qparams_from_range(
    xmin: torch.Tensor,
    xmax: torch.Tensor,
    args: QuantizationArgs,
    scale_dtype: torch.dtype,
    global_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' `calculate_qparams` for a range that already contains 0.

    The arithmetic runs in `scale_dtype`, as compressed-tensors runs it in the dtype of the
    weights it observes, so that a bfloat16 model gets the very scales and zero points
    llm-compressor would give it (each bfloat16 operation rounds). Float grids call it
    (`formats.float_qparams`); their zero points are 0.
    """
    if args.is_float:
        scale = float_qparams(xmin, xmax, args, scale_dtype, global_scale)
        return scale, torch.zeros_like(scale, dtype=torch.int8)
    xmin, xmax = xmin.to(scale_dtype), xmax.to(scale_dtype)
    if args.symmetric:
        scale = torch.maximum(-xmin, xmax) / ((args.qmax - args.qmin) / 2)
        zero_point = torch.zeros_like(scale, dtype=torch.int8)
    else:
        scale = (xmax - xmin) / (args.qmax - args.qmin)
        zero_point = torch.clamp(args.qmin - xmin / scale, args.qmin, args.qmax).round()
        # An all-zero range gives 0 / 0 here; compressed-tensors stores 0 for it, and so do we.
        zero_point = torch.where(scale == 0, 0, zero_point).to(torch.int8)
    scale = torch.where(scale == 0, torch.finfo(scale_dtype).eps, scale)
    return scale, zero_point


def round_to_grid(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, args: QuantizationArgs
) -> torch.Tensor:
    """Integer grid values clamp(round(x / scale + zero_point)), as float32; broadcasts. On a
    float grid, `scale` is the effective one and the format's value nearest x / scale."""
    if args.is_float:
        return round_to_float_grid(x.float() / scale.float(), args)
    return torch.clamp(
        torch.round(x.float() / scale.float() + zero_point.float()), args.qmin, args.qmax
    )


def _broadcast(
    W: torch.Tensor,
    qparam: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`W` (out, in) and a scale or zero point, shaped to broadcast against each other.

    Groups of consecutive columns become (out, groups, group_size) against (out, groups, 1):
    views, where gathering the qparam to every column would copy a weight-sized tensor. Only
    a `g_idx` (groups that are not runs of columns) or a last group shorter than the others
    needs that gather. Reshape results to `W.shape`.
    """
    if args.strategy == "tensor":
        return W, qparam.reshape(1, 1)
    if args.strategy == "channel":
        return W, qparam
    if args.strategy == "block":
        (bh, bw), (ob, ib) = blocks(W.shape, args)
        return W.reshape(ob, bh, ib, bw), qparam.reshape(ob, 1, ib, 1)
    assert args.group_size is not None  # guaranteed by QuantizationArgs
    in_features = W.shape[1]
    if g_idx is None and in_features % args.group_size == 0:
        return W.reshape(W.shape[0], -1, args.group_size), qparam.unsqueeze(-1)
    if g_idx is None:
        g_idx = torch.arange(in_features, device=qparam.device) // args.group_size
    return W, qparam[:, g_idx.long()]


def quantize_to_int(
    W: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Integer values (int8, same shape as `W`) of `W` on the grid given by `scale`/`zero_point`;
    a float grid's values (`code_dtype`).

    `g_idx` maps each input column to its group when groups are not consecutive columns.
    """
    weights, s = _broadcast(W, scale, args, g_idx)
    _, z = _broadcast(W, zero_point, args, g_idx)
    if args.is_float:
        s = effective_scale(s, global_scale)
    return round_to_grid(weights, s, z, args).to(code_dtype(args)).reshape(W.shape)


def dequantize(
    int_weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    global_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """(q - zero_point) * scale, in `dtype` (default: the scale's dtype).

    The product is exact in float32 for up to 8-bit integers and bf16/fp16/fp32 scales, so the
    single rounding to `dtype` gives the same bits as compressed-tensors' `dequantize`. A float
    grid's value times its effective scale (NVFP4's divided by the global scale in float32)
    is compressed-tensors' own float32 product, rounded once as it rounds it.
    """
    integers, s = _broadcast(int_weight, scale, args, g_idx)
    if args.is_float:
        weight = integers.float() * effective_scale(s, global_scale)
        if global_scale is not None:  # compressed-tensors unpacks NVFP4 to bfloat16, and so
            weight = weight.to(torch.bfloat16)  # rounds the product there whatever the model
        return weight.to(dtype or scale.dtype).reshape(int_weight.shape)
    _, z = _broadcast(int_weight, zero_point, args, g_idx)
    weight = (integers.float() - z.float()) * s.float()
    return weight.to(dtype or scale.dtype).reshape(int_weight.shape)


def fake_quantize(
    W: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None = None,
    global_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """`W` rounded to its grid and mapped back, in `W`'s dtype."""
    int_weight = quantize_to_int(W, scale, zero_point, args, g_idx, global_scale)
    return dequantize(int_weight, scale, zero_point, args, g_idx, W.dtype, global_scale)


def rtn(W: torch.Tensor, args: QuantizationArgs) -> QuantizedWeight:
    """Round-to-nearest: each weight to the nearest grid point, no error compensation.

    The baseline GPTQ has to beat. `args.actorder` is irrelevant here (nothing is ordered).
    """
    gscale = tensor_global_scale(W, args)
    scale, zero_point = compute_qparams(W, args, global_scale=gscale)
    int_weight = quantize_to_int(W, scale, zero_point, args, global_scale=gscale)
    weight = dequantize(int_weight, scale, zero_point, args, dtype=W.dtype, global_scale=gscale)
    return QuantizedWeight(weight, int_weight, scale, zero_point, args, global_scale=gscale)


def channel_args(args: QuantizationArgs) -> QuantizationArgs:
    """`args` with one scale per row: used to fit a single group's columns at a time."""
    return dataclasses.replace(args, strategy="channel", group_size=None, actorder=None)
