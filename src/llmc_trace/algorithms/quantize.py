"""Map weights to an integer grid and back, with compressed-tensors' exact arithmetic.

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

    Invariant: `weight == dequantize(int_weight, scale, zero_point, args, g_idx, weight.dtype)`
    exactly, so a checkpoint holding `int_weight`, `scale` and `zero_point` loads as `weight`.
    `weight` is `None` in what a compressor keeps for the checkpoint (:meth:`integers_only`):
    the dense copy lives in the module, and a second one per layer would cost a model's worth
    of host memory on a GPU run.
    """

    weight: torch.Tensor | None  # (out, in) dequantized, in the dtype of the weight it came from
    int_weight: torch.Tensor  # (out, in) int8 in [args.qmin, args.qmax]
    scale: torch.Tensor  # (out, groups), (out, 1) for channel, (1,) for tensor; weight dtype
    zero_point: torch.Tensor  # int8, same shape as scale; all zeros when symmetric
    args: QuantizationArgs
    g_idx: torch.Tensor | None = None  # (in,) int32 group of each input column; actorder "group"

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
        )

    def dequantized(self) -> torch.Tensor:
        """The dense weight the integers stand for, in the scale's dtype (the model's)."""
        return dequantize(self.int_weight, self.scale, self.zero_point, self.args, self.g_idx)


def compute_qparams(
    W: torch.Tensor, args: QuantizationArgs, *, scale_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(scale, zero_point)` for `W` (out, in), shaped as compressed-tensors stores them.

    `scale` is in `scale_dtype` (default: `W.dtype`, the checkpoint's dtype) and `zero_point`
    is int8. Group-wise scales need `in_features` to be a multiple of `group_size`.
    """
    out_features, in_features = W.shape
    if args.strategy == "tensor":
        rows = W.reshape(1, -1)
    elif args.strategy == "channel":
        rows = W
    else:
        rows = W.reshape(out_features * num_groups(in_features, args), -1)
    scale, zero_point = _row_qparams(rows.float(), args, scale_dtype or W.dtype)
    if args.strategy == "tensor":
        return scale.reshape(1), zero_point.reshape(1)
    return scale.reshape(out_features, -1), zero_point.reshape(out_features, -1)


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
    rows: torch.Tensor, args: QuantizationArgs, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of `rows` (R, C), by min-max or by the MSE search."""
    xmin = rows.amin(dim=1).clamp(max=0)
    xmax = rows.amax(dim=1).clamp(min=0)
    scale, zero_point = _qparams_from_range(xmin, xmax, args, scale_dtype)
    if args.observer == "minmax":
        return scale, zero_point
    best_err = torch.full_like(xmin, torch.inf)
    for i in range(int(MSE_MAXSHRINK * MSE_GRID)):
        shrink = 1 - i / MSE_GRID
        candidate_scale, candidate_zp = _qparams_from_range(
            shrink * xmin, shrink * xmax, args, scale_dtype
        )
        s, z = candidate_scale.float()[:, None], candidate_zp.float()[:, None]
        err = ((round_to_grid(rows, s, z, args) - z) * s - rows).abs().pow(MSE_NORM).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        scale = torch.where(better, candidate_scale, scale)
        zero_point = torch.where(better, candidate_zp, zero_point)
    return scale, zero_point


def _qparams_from_range(
    xmin: torch.Tensor, xmax: torch.Tensor, args: QuantizationArgs, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors' `calculate_qparams` for a range that already contains 0.

    The arithmetic runs in `scale_dtype`, as compressed-tensors runs it in the dtype of the
    weights it observes, so that a bfloat16 model gets the very scales and zero points
    llm-compressor would give it (each bfloat16 operation rounds).
    """
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
    """Integer grid values clamp(round(x / scale + zero_point)), as float32; broadcasts."""
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
) -> torch.Tensor:
    """Integer values (int8, same shape as `W`) of `W` on the grid given by `scale`/`zero_point`.

    `g_idx` maps each input column to its group when groups are not consecutive columns.
    """
    weights, s = _broadcast(W, scale, args, g_idx)
    _, z = _broadcast(W, zero_point, args, g_idx)
    return round_to_grid(weights, s, z, args).to(torch.int8).reshape(W.shape)


def dequantize(
    int_weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """(q - zero_point) * scale, in `dtype` (default: the scale's dtype).

    The product is exact in float32 for up to 8-bit integers and bf16/fp16/fp32 scales, so the
    single rounding to `dtype` gives the same bits as compressed-tensors' `dequantize`.
    """
    integers, s = _broadcast(int_weight, scale, args, g_idx)
    _, z = _broadcast(int_weight, zero_point, args, g_idx)
    weight = (integers.float() - z.float()) * s.float()
    return weight.to(dtype or scale.dtype).reshape(int_weight.shape)


def fake_quantize(
    W: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    args: QuantizationArgs,
    g_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """`W` rounded to its grid and mapped back, in `W`'s dtype."""
    int_weight = quantize_to_int(W, scale, zero_point, args, g_idx)
    return dequantize(int_weight, scale, zero_point, args, g_idx, W.dtype)


def rtn(W: torch.Tensor, args: QuantizationArgs) -> QuantizedWeight:
    """Round-to-nearest: each weight to the nearest grid point, no error compensation.

    The baseline GPTQ has to beat. `args.actorder` is irrelevant here (nothing is ordered).
    """
    scale, zero_point = compute_qparams(W, args)
    int_weight = quantize_to_int(W, scale, zero_point, args)
    weight = dequantize(int_weight, scale, zero_point, args, dtype=W.dtype)
    return QuantizedWeight(weight, int_weight, scale, zero_point, args)


def channel_args(args: QuantizationArgs) -> QuantizationArgs:
    """`args` with one scale per row: used to fit a single group's columns at a time."""
    return dataclasses.replace(args, strategy="channel", group_size=None, actorder=None)
