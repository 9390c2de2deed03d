"""One block of GPTQ's column sweep as one GPU kernel (Triton), for grids fitted up front.

Within a block the sweep visits its columns one by one: round column i to its grid, then
spread w - q over the block's later columns (a rank-1 update). Written with torch ops that is
about seven kernel launches per column, each a few microseconds of launch and dispatch for
microseconds of work: on an H200, 84 us per column, 0.35 s for a 4096 x 4096 layer whose matrix
products take 5 ms. The steps of one output row never read another row's, so here each program
owns a tile of rows and all of the block's columns, keeps the tile in registers, and walks the
columns in one launch: a block costs one kernel however many columns it has.

The arithmetic is `SweepGrid.quantize_into`'s and the rank-1 update's, op for op: IEEE
division by the scale, rounding half to even, the zero point added before clamping and taken
off before the scale, a pruned weight held at the zero point, every product rounded before it
is subtracted (no fused multiply-adds). On the CPU, through the interpreter, the integers are
the torch loop's bit for bit (`tests/algorithms/test_sweep_kernel.py`).

Scales fitted inside the sweep (`SweepGrid.fits_in_sweep`: the original GPTQ's per-group fits)
need the group's columns as the sweep has updated them and stay on the torch ops; so do CPUs,
where a launch costs nothing and Triton does not run. `TRITON_INTERPRET=1`, set before Triton is
first imported, runs the kernel on the CPU through Triton's interpreter: how the tests check it
without a GPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from llmc_trace.algorithms.grid import SweepGrid

ROWS_PER_PROGRAM = 32
"""Output rows each program owns: a 128-column block's tile is then 4,096 floats, 32
registers per thread at 4 warps, and a 4096-row layer gives 128 programs, about one per SM."""


def kernel_sweeps(grid: SweepGrid, device: torch.device) -> bool:
    """Whether `gptq` sweeps each block with the kernel: on a CUDA device with Triton, for a
    grid whose scales are all fitted before the sweep; or anywhere under `TRITON_INTERPRET=1`
    when Triton is installed (the tests' way to run it on a CPU). The kernel rounds to
    integers: float grids (FP8, FP4) sweep with the torch ops."""
    if grid.fits_in_sweep or grid.args.is_float or not _triton_installed():
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def sweep_block(
    grid: SweepGrid,
    i1: int,
    W1: torch.Tensor,
    V1: torch.Tensor,
    integers: torch.Tensor,
    dequantized: torch.Tensor,
    diff: torch.Tensor,
) -> None:
    """The sweep over the block of sweep positions `i1` to `i1 + k`, in one launch.

    `W1` (k, out) holds the block's columns as the sweep reaches it (row i: column i1 + i) and
    is used up; `V1` (k, k) is U's block with each row divided by its diagonal entry. Writes
    each column's integers, their grid values, and w - q into `integers`, `dequantized` and
    `diff` (each (k, out) float32), exactly what the torch loop in `gptq` writes."""
    columns, rows = W1.shape
    scales, zero_points = grid.block_qparams(i1, i1 + columns)
    held = grid.block_zeros(i1, i1 + columns)
    args = grid.args
    launch = (-(-rows // ROWS_PER_PROGRAM),)
    _kernel()[launch](
        W1, V1, scales, zero_points, held if held is not None else W1,
        integers, dequantized, diff,
        columns, rows, float(args.qmin), float(args.qmax),
        SYMMETRIC=args.symmetric, HOLDS_ZEROS=held is not None,
        BLOCK=_next_power_of_2(columns), ROWS=ROWS_PER_PROGRAM,
        enable_fp_fusion=False,  # each product rounded on its own, as the torch ops round it
    )  # fmt: skip


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _kernel() -> Any:
    """The kernel, made on first use, so that importing llmc-trace never imports Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def sweep(
        W, V, S, Z, HELD, INTEGERS, DEQUANTIZED, DIFF,
        columns, rows, qmin, qmax,
        SYMMETRIC: tl.constexpr, HOLDS_ZEROS: tl.constexpr,
        BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        column = tl.arange(0, BLOCK)
        row_in = row < rows
        column_in = column < columns
        tile = tl.load(
            W + column[:, None] * rows + row[None, :],
            mask=column_in[:, None] & row_in[None, :],
            other=0.0,
        )
        for i in range(0, columns):
            at = i * rows + row
            # column i of the tile: the one nonzero term of each sum, so the value exactly
            w = tl.sum(tl.where(column[:, None] == i, tile, 0.0), axis=0)
            s = tl.load(S + at, mask=row_in, other=1.0)
            grid = tl.math.div_rn(w, s)
            if not SYMMETRIC:
                z = tl.load(Z + at, mask=row_in, other=0.0)
                grid = grid + z
            # adding and taking off 1.5 * 2^23 rounds a float32 below 2^22 in magnitude to an
            # integer, ties to even, as torch.round does (the sum keeps no bits below the
            # unit), in two additions the interpreter runs too; larger ones are clamped anyway
            grid = tl.minimum(tl.maximum(grid, -4194304.0), 4194304.0)
            grid = (grid + 12582912.0) - 12582912.0
            grid = tl.minimum(tl.maximum(grid, qmin), qmax)
            if HOLDS_ZEROS:
                held = tl.load(HELD + at, mask=row_in, other=0) != 0
                if SYMMETRIC:
                    grid = tl.where(held, 0.0, grid)
                else:
                    grid = tl.where(held, z, grid)
            if SYMMETRIC:
                q = grid * s
            else:
                q = (grid - z) * s
            d = w - q
            tl.store(INTEGERS + at, grid, mask=row_in)
            tl.store(DEQUANTIZED + at, q, mask=row_in)
            tl.store(DIFF + at, d, mask=row_in)
            v = tl.load(V + i * columns + column, mask=column_in, other=0.0)
            tile = tile - v[:, None] * d[None, :]

    return sweep
