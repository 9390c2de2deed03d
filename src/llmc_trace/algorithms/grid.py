"""Round weight columns to their quantization grid, one at a time, during an OBS column sweep.

GPTQ, and SparseGPT when it also quantizes, visit the columns of W one by one (in input order,
or permuted by act-order) and round each before spreading its error over the columns not yet
visited. `SweepGrid` holds what that rounding needs: which group (and so which scale and zero
point) each visited column belongs to, when each group's scale is fitted, and the integers
chosen so far.

When scales are fitted:

* per tensor or per channel: once, up front, from the whole weight;
* group-wise in input order (`actorder=None`) or in sweep order (`actorder="group"`): when the
  sweep reaches the group's first column, from the group's weights as updated by the error of
  every column before it (the original GPTQ); or up front from the original weights when
  `static_groups` is set (AutoGPTQ's `static_groups`, llm-compressor's behaviour);
* group-wise with `actorder="static"`: always up front, from the original weights. Groups keep
  their input-order columns while the sweep visits columns by act-order, so a group's columns
  are spread over the whole sweep and there is no point at which all of them are up to date;
* float grids (FP8, NVFP4, MX): always up front (NVFP4's group scales hang off a global scale
  of the whole weight). A 128x128 block is a group of 128 columns whose scale differs every 128
  rows. Rounding a column is the format's rounding rule (`formats.round_to_float_grid`), and
  the error is spread as on an integer grid.
"""

from __future__ import annotations

import math

import torch

from llmc_trace.algorithms.formats import effective_scale, round_to_float_grid, tensor_global_scale
from llmc_trace.algorithms.quantize import (
    QuantizedWeight,
    blocks,
    channel_args,
    code_dtype,
    compute_qparams,
    dequantize,
    num_groups,
    round_to_grid,
)
from llmc_trace.algorithms.scheme import QuantizationArgs


class SweepGrid:
    """The grid of every column of a weight, for a sweep that visits columns in `perm` order.

    `W` (out, in) is float32 and already in sweep order (`W_original[:, perm]`), with dead
    columns zeroed; `perm` is None when the sweep follows input order. Scales are rounded to
    `scale_dtype` (the checkpoint's dtype) before any integer is chosen with them.

    `zeros` (out, in, bool, sweep order) marks weights that must stay exactly zero whatever the
    sweep proposes: the mask of an earlier pruning stage. Their integers are the zero point
    (0 dequantizes to exactly 0 on every grid), and no refinement move touches them.
    """

    def __init__(
        self,
        W: torch.Tensor,
        args: QuantizationArgs,
        *,
        perm: torch.Tensor | None,
        static_groups: bool,
        scale_dtype: torch.dtype,
        zeros: torch.Tensor | None = None,
    ) -> None:
        out_features, in_features = W.shape
        self.zeros = zeros
        self.args = args
        self.scale_dtype = scale_dtype
        if args.strategy == "block":
            (rows_per_block, self.group_size), _ = blocks(W.shape, args)
        else:
            rows_per_block = 1
            self.group_size = args.group_size if args.group_size is not None else in_features
        self.fits_in_sweep = (
            args.strategy == "group"
            and not args.is_float
            and args.actorder != "static"
            and not static_groups
        )
        position = torch.arange(in_features, device=W.device)
        if args.strategy in ("tensor", "channel"):
            group_of = torch.zeros_like(position)
        elif args.actorder == "static":
            assert perm is not None  # act-order always permutes
            group_of = perm // self.group_size
        else:
            group_of = position // self.group_size
        self.group_of: list[int] = group_of.tolist()  # group of each sweep position
        self._group_index = group_of
        #: the groups are runs of `group_size` consecutive sweep positions, none shorter
        self._runs = args.actorder != "static" and in_features % self.group_size == 0

        # Scales and zero points are held in float32, one contiguous row per group: the sweep
        # reads one group's per column, and a ready row saves a gather and a cast on each of
        # thousands of columns. float32 holds every scale_dtype value and int8 exactly, so
        # `result` gets the stored values back unchanged. A float grid's rows hold its effective
        # scales (NVFP4's divided by the global scale), and `_stored` the scales as stored.
        self.global_scale: torch.Tensor | None = None
        self._stored: torch.Tensor | None = None
        if self.fits_in_sweep:
            shape = (num_groups(in_features, args), out_features)
            self._scales = torch.empty(shape, device=W.device)
            self._zero_points = torch.zeros(shape, device=W.device)
        else:
            if args.actorder == "static" and perm is not None:
                W = W[:, torch.argsort(perm)]  # groups are input-order columns
            self.global_scale = tensor_global_scale(W, args)
            scale, zero_point = compute_qparams(
                W, args, scale_dtype=scale_dtype, global_scale=self.global_scale
            )
            if args.is_float:
                self._stored = scale
                scale = effective_scale(scale, self.global_scale)
            if rows_per_block > 1:  # a block's scale is every one of its rows' scale
                scale = scale.repeat_interleave(rows_per_block, dim=0)
                zero_point = zero_point.repeat_interleave(rows_per_block, dim=0)
            # (groups, rows); (1, 1) per tensor
            self._scales = scale.reshape(scale.shape[0], -1).T.float().contiguous()
            self._zero_points = zero_point.reshape(scale.shape[0], -1).T.float().contiguous()
        # One view per group, made once: `quantize_into` then reads a column's scale and zero
        # point by a list lookup. `fit` writes into these rows in place, so the views stay valid.
        self._scale_rows = self._scales.unbind()
        self._zero_point_rows = self._zero_points.unbind()
        self._zeros_by_column = zeros.T.contiguous() if zeros is not None else None  # (in, out)
        self._zero_columns = (
            self._zeros_by_column.unbind() if self._zeros_by_column is not None else None
        )
        self.int_weight = torch.zeros(
            out_features, in_features, dtype=code_dtype(args), device=W.device
        )

    def aligned(self, blocksize: int, multiple_of: int = 1) -> int:
        """A block size near `blocksize` that no group fitted in the sweep (nor any run of
        `multiple_of` columns) straddles: a group fitted at its first column then sees all its
        columns up to date, and an N:M run lies in one block."""
        unit = math.lcm(self.group_size if self.fits_in_sweep else 1, multiple_of)
        return max(blocksize // unit, 1) * unit

    def starts_group(self, column: int) -> bool:
        """Whether the sweep must fit a scale at this sweep position before rounding it."""
        return self.fits_in_sweep and column % self.group_size == 0

    def fit(self, column: int, W_group: torch.Tensor) -> None:
        """Fit the scale and zero point of the group starting at `column` to `W_group`."""
        group = self.group_of[column]
        scale, zero_point = compute_qparams(
            W_group, channel_args(self.args), scale_dtype=self.scale_dtype
        )
        self._scales[group] = scale[:, 0]
        self._zero_points[group] = zero_point[:, 0]

    def quantize_into(
        self, column: int, w: torch.Tensor, integers: torch.Tensor, dequantized: torch.Tensor
    ) -> None:
        """Round the column `w` (out,) at sweep position `column` to its grid: the integers into
        `integers`, their grid values into `dequantized` (both (out,) float32; `dequantized`
        may be `w` itself). Call `set_block` to keep the integers.

        The sweeps' per-column step, so it allocates nothing: every op writes into the given
        buffers. The arithmetic is `round_to_grid`'s and `dequantize`'s, op for op, so the
        results are bit for bit theirs; a symmetric grid's zero point is 0 and is not added.
        """
        group = self.group_of[column]
        s, z = self._scale_rows[group], self._zero_point_rows[group]
        if self.args.is_float:  # the format's rounding rule, then as a symmetric grid
            integers.copy_(round_to_float_grid(torch.div(w, s), self.args))
            if self._zero_columns is not None:
                integers.masked_fill_(self._zero_columns[column], 0)
            torch.mul(integers, s, out=dequantized)
            return
        torch.div(w, s, out=integers)
        if not self.args.symmetric:
            integers.add_(z)
        integers.round_().clamp_(self.args.qmin, self.args.qmax)
        if self._zero_columns is not None:
            torch.where(self._zero_columns[column], z, integers, out=integers)
        if self.args.symmetric:
            torch.mul(integers, s, out=dequantized)
        else:
            torch.sub(integers, z, out=dequantized).mul_(s)

    def block_qparams(self, i1: int, i2: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 scales and zero points of sweep positions `i1` to `i2`, one contiguous row
        per position, each (k, out): what a kernel sweeping the block reads column by column."""
        groups = self._group_index[i1:i2]
        rows = self.int_weight.shape[0]
        shape = (i2 - i1, rows)
        scales = self._scales[groups].expand(shape).contiguous()
        return scales, self._zero_points[groups].expand(shape).contiguous()

    def block_zeros(self, i1: int, i2: int) -> torch.Tensor | None:
        """The weights held at zero at sweep positions `i1` to `i2`, (k, out) bool, or None."""
        if self._zeros_by_column is None:
            return None
        return self._zeros_by_column[i1:i2]

    def set_block(self, column: int, integers: torch.Tensor) -> None:
        """Keep the integers (k, out), float32, chosen for sweep positions `column` to
        `column + k`: one conversion per block instead of one per column."""
        self.int_weight[:, column : column + integers.shape[0]] = integers.T

    def qparams(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 scales and zero points of the sweep positions `columns`, each (out, k);
        (1, k) for a per-tensor scale, which broadcasts."""
        groups = self._group_index[columns]
        return self._scales[groups].T, self._zero_points[groups].T

    def dequantized(self, columns: torch.Tensor) -> torch.Tensor:
        """The chosen integers of the sweep positions `columns`, dequantized, (out, k) float32."""
        s, z = self.qparams(columns)
        return (self.int_weight[:, columns].float() - z) * s

    def nearest(self, W: torch.Tensor, row: int) -> torch.Tensor:
        """Round-to-nearest of `W` (k, in), rows `row` to `row + k` of the sweep-order weight:
        each weight on its nearest grid point with the scales fitted up front, dequantized in
        the scales' dtype (as `dequantize` stores a weight) and returned in float32.

        `round_to_grid` and `dequantize` op for op (so bit for bit), in place on one (k, in)
        result, against scales broadcast over runs of `group_size` columns where the groups
        are such runs: no scale or zero point is gathered to every column."""
        assert not self.fits_in_sweep  # scales fitted in the sweep exist only as it goes
        s, z = self._scales.T, self._zero_points.T  # (out, groups); (1, 1) per tensor
        if self.args.strategy != "tensor":
            s, z = s[row : row + W.shape[0]], z[row : row + W.shape[0]]
        shape = W.shape
        if s.shape[1] > 1 and self._runs:  # (k, groups, group_size) against (k, groups, 1)
            W, s, z = W.reshape(shape[0], -1, self.group_size), s[..., None], z[..., None]
        elif s.shape[1] > 1:  # groups spread over the sweep (act-order): gathered row-major
            s = s.contiguous()[:, self._group_index]
            if not self.args.symmetric:
                z = z.contiguous()[:, self._group_index]
        grid = torch.div(W, s)
        if self.args.is_float:
            grid = round_to_float_grid(grid, self.args)
        else:
            if not self.args.symmetric:  # a symmetric grid's zero point is 0
                grid.add_(z)
            grid.round_().clamp_(self.args.qmin, self.args.qmax)
        if not self.args.symmetric:
            grid.sub_(z)
        grid = grid.mul_(s).reshape(shape)
        return grid if self.scale_dtype == torch.float32 else grid.to(self.scale_dtype).float()

    def nearer(self, columns: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Integers of the grid points nearest `target` (out, k) at the sweep positions
        `columns`, but only where strictly nearer than the chosen ones (elsewhere the chosen
        ones): a move that does not lower the distance is never made, so a descent that moves
        by this rule cannot cycle."""
        s, z = self.qparams(columns)
        chosen = self.int_weight[:, columns].float()
        nearest = round_to_grid(target, s, z, self.args)
        closer = ((nearest - z) * s - target).abs() < ((chosen - z) * s - target).abs()
        if self.zeros is not None:
            closer &= ~self.zeros[:, columns]
        return torch.where(closer, nearest, chosen)

    def set(self, column: int, integers: torch.Tensor) -> torch.Tensor:
        """Choose `integers` (out,) at sweep position `column`; return them dequantized."""
        self.int_weight[:, column] = integers.to(self.int_weight.dtype)
        group = self.group_of[column]
        return (integers - self._zero_points[group]) * self._scales[group]

    def result(self, perm: torch.Tensor | None, dtype: torch.dtype) -> QuantizedWeight:
        """The integers chosen, back in input order, with their scales, as a `QuantizedWeight`."""
        int_weight, g_idx = self.int_weight, None
        if perm is not None:
            inverse = torch.argsort(perm)
            int_weight = int_weight[:, inverse]
            if self.args.actorder == "group":
                group_of = torch.tensor(self.group_of, device=perm.device)
                g_idx = group_of[inverse].to(torch.int32)
        scale = self._scales.T.to(self.scale_dtype).contiguous()
        zero_point = self._zero_points.T.to(torch.int8).contiguous()
        if self._stored is not None:  # a float grid's scales as stored, not its effective ones
            scale, zero_point = self._stored, torch.zeros_like(self._stored, dtype=torch.int8)
        elif self.args.strategy == "tensor":
            scale, zero_point = scale.reshape(1), zero_point.reshape(1)
        weight = dequantize(
            int_weight, scale, zero_point, self.args, g_idx, dtype, self.global_scale
        )
        return QuantizedWeight(
            weight, int_weight, scale, zero_point, self.args, g_idx, self.global_scale
        )
