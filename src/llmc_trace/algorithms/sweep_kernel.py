"""One block of GPTQ's or SparseGPT's column sweep as one GPU kernel (Triton).

Within a block the sweep visits its columns one by one: decide column i (round it to its grid,
or prune it) and spread w - q over the block's later columns (a rank-1 update). Written with
torch ops that is about seven kernel launches per column, each a few microseconds of launch and
dispatch for microseconds of work: on an H200, 84 us per column, 0.35 s for a 4096 x 4096 layer
whose matrix products take 5 ms. The steps of one output row never read another row's, so here
each program owns a tile of rows and all of the block's columns, keeps the tile in registers,
and walks the columns in one launch: a block costs one kernel however many columns it has.

GPTQ (`sweep_block`) rounds every column, holding given weights at the zero point. SparseGPT
(`prune_block`) prunes: for unstructured sparsity its block's mask is chosen before the sweep
from all rows together (`sparsegpt` does that with torch ops) and the kernel holds those
weights at zero; for N:M each row's run of M columns is chosen inside the kernel when the sweep
reaches it, from the weights as updated so far (the paper's adaptive mask). Either may also
round the kept weights to a grid fitted up front.

The arithmetic is the torch loops' op for op: IEEE division by the scale (and for N:M scores,
w * w divided by the squared diagonal), rounding half to even, the zero point added before
clamping and taken off before the scale, a pruned weight held at the zero point, the N:M runs'
M - N lowest scores with ties to the earlier column (a stable sort's choice), every product
rounded before it is subtracted (no fused multiply-adds, as SparseGPT's loop rounds them; GPTQ's
loop updates with `addr_`, which a CPU may fuse, so there only the integers are compared). On
the CPU, through the interpreter, GPTQ's integers and SparseGPT's masks, weights and integers
are the torch loops' bit for bit (`tests/algorithms/test_interpreted_kernels.py`, on the cases
of `test_sweep_kernel.py` and `test_prune_kernel.py` beside it).

Scales fitted inside the sweep (`SweepGrid.fits_in_sweep`: the original GPTQ's per-group fits,
and SparseGPT's quantized groups) need the group's columns as the sweep has updated them and
stay on the torch ops; so do CPUs, where a launch costs nothing and Triton does not run.
`TRITON_INTERPRET=1`, set before Triton is first imported, runs the kernel on the CPU through
Triton's interpreter: how the tests check it without a GPU.

Where the kernel would run but cannot (Triton not importable, its interpreter unable to run
with this numpy, or compiling the kernel raising) the sweeps fall back to the torch ops with one
`KernelFallbackWarning` per process naming why (`kernel_sweeps`, `sweep_block`, `prune_block`):
the same results, only slower. `kernel_fallback_reason` tells a report why.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.algorithms.grid import SweepGrid
from llmc_trace.core.versions import dotted, release

ROWS_PER_PROGRAM = 32
"""Output rows each program owns: a 128-column block's tile is then 4,096 floats, 32
registers per thread at 4 warps, and a 4096-row layer gives 128 programs, about one per SM."""


class KernelFallbackWarning(RuntimeWarning):
    """The sweep kernel would run here but cannot; the torch ops sweep instead (slower)."""


_INSTALL_ADVICE = "install the Triton release that matches this torch to use the kernel"


@dataclass
class _Fallback:
    """Why this process sweeps with torch ops where the kernel would run (None: it need not)."""

    reason: str | None = None

    def give_up(self, reason: str, advice: str = _INSTALL_ADVICE) -> None:
        """Record `reason` and warn, once per process: every later sweep takes the torch ops."""
        if self.reason is None:
            self.reason = reason
            warnings.warn(
                f"{reason}: GPTQ and SparseGPT sweep each block with torch ops instead of one "
                f"Triton kernel (the same results, several times slower on a GPU); {advice}.",
                KernelFallbackWarning,
                stacklevel=4,
            )


_FALLBACK = _Fallback()


def kernel_sweeps(grid: SweepGrid | None, device: torch.device) -> bool:
    """Whether a sweep on `device` runs each block as one kernel: on a CUDA device, or
    anywhere under `TRITON_INTERPRET=1` (the tests' way to run it on a CPU), for a sweep with
    no grid (SparseGPT pruning alone) or a grid whose scales are all fitted before the sweep.
    The kernel rounds to integers: float grids (FP8, FP4) sweep with the torch ops. Where the
    kernel would run but Triton cannot be imported, or its interpreter cannot run here
    (`interpreter_problem`), warns once (`KernelFallbackWarning`) and says no."""
    if grid is not None and (grid.fits_in_sweep or grid.args.is_float):
        return False
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not interpreting:
        return False
    if _FALLBACK.reason is None and (missing := _triton_import_error()) is not None:
        _FALLBACK.give_up(f"Triton cannot be imported ({missing})")
    if _FALLBACK.reason is None and interpreting and (problem := interpreter_problem()):
        _FALLBACK.give_up(problem, advice=_INTERPRETER_ADVICE)
    return _FALLBACK.reason is None


def kernel_fallback_reason() -> str | None:
    """Why this process's sweeps take the torch ops where the kernel would run (the text of its
    `KernelFallbackWarning`), or None while nothing has stopped the kernel: for reports that
    time the sweeps and must say which of the two they timed."""
    return _FALLBACK.reason


#: Triton's first release whose interpreter squeezes a scalar argument before ``int()``.
_INTERPRETER_FIXED = (3, 7)
#: numpy's first release that refuses `int()` of a one-element array with a dimension.
_NUMPY_STRICT = (2, 4)
_INTERPRETER_ADVICE = (
    f"Triton {dotted(_INTERPRETER_FIXED)} or later, or numpy before {dotted(_NUMPY_STRICT)}, "
    "runs the kernel through the interpreter"
)


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernel in this environment, or None.

    The interpreter holds a scalar argument (the block's column count) as a one-element array;
    before 3.7 it turns that into a loop bound with `int(array)`, which numpy 2.4 refuses
    ("only 0-dimensional arrays can be converted to Python scalars"). torch 2.11 pins Triton
    3.6, so a fresh environment with it and numpy 2.4 or later meets this: the compiled kernel on
    a GPU is unaffected, only the CPU's check of it."""
    import numpy
    import triton

    old_triton = release(triton.__version__) < _INTERPRETER_FIXED
    if old_triton and release(numpy.__version__) >= _NUMPY_STRICT:
        return (
            f"Triton {triton.__version__}'s interpreter cannot run the sweep kernel with numpy "
            f"{numpy.__version__} (it turns the kernel's scalar arguments into one-element "
            f"arrays, which numpy {dotted(_NUMPY_STRICT)} and later refuse to convert to "
            "integers)"
        )
    return None


def sweep_block(
    grid: SweepGrid,
    i1: int,
    W1: torch.Tensor,
    V1: torch.Tensor,
    integers: torch.Tensor,
    dequantized: torch.Tensor,
    diff: torch.Tensor,
) -> bool:
    """GPTQ's sweep over the block of sweep positions `i1` to `i1 + k`, in one launch.

    `W1` (k, out) holds the block's columns as the sweep reaches it (row i: column i1 + i) and
    is used up; `V1` (k, k) is U's block with each row divided by its diagonal entry. Writes
    each column's integers, their grid values, and w - q into `integers`, `dequantized` and
    `diff` (each (k, out) float32), exactly what the torch loop in `gptq` writes. False when
    the kernel cannot run (see `KernelFallbackWarning`): nothing was written, and the caller
    sweeps the block with torch ops."""
    held = grid.block_zeros(i1, i1 + W1.shape[0])
    return _launch(W1, V1, grid, i1, held, None, None, integers, dequantized, diff)


def prune_block(
    W1: torch.Tensor,
    V1: torch.Tensor,
    mask: torch.Tensor,
    n_m: tuple[int, int] | None,
    d2: torch.Tensor,
    grid: SweepGrid | None,
    i1: int,
    integers: torch.Tensor,
    dequantized: torch.Tensor,
    diff: torch.Tensor,
) -> bool:
    """SparseGPT's sweep over the block of sweep positions `i1` to `i1 + k`, in one launch.

    `W1`, `V1`, `dequantized` (what each weight becomes) and `diff` as for `sweep_block`.
    Unstructured (`n_m` None): `mask` (k, out, bool) holds the block's pruned weights, chosen
    before. N:M: the kernel chooses them, every M columns, from the scores w^2 / `d2` (`d2`
    (k,): U's squared diagonal), and writes them into `mask`. With `grid` (scales fitted up
    front) the kept weights are rounded too, their integers written into `integers`. False
    when the kernel cannot run (see `sweep_block`)."""
    return _launch(W1, V1, grid, i1, mask, n_m, d2, integers, dequantized, diff)


def _launch(
    W1: torch.Tensor,
    V1: torch.Tensor,
    grid: SweepGrid | None,
    i1: int,
    held: torch.Tensor | None,
    n_m: tuple[int, int] | None,
    d2: torch.Tensor | None,
    integers: torch.Tensor,
    dequantized: torch.Tensor,
    diff: torch.Tensor,
) -> bool:
    """One launch of the kernel over a block; False, with the one warning, when Triton cannot
    compile it (compiling precedes the launch: no buffer has been written then)."""
    if _FALLBACK.reason is not None:
        return False
    columns, rows = W1.shape
    if grid is not None:
        scales, zero_points = grid.block_qparams(i1, i1 + columns)
        qmin, qmax, symmetric = float(grid.args.qmin), float(grid.args.qmax), grid.args.symmetric
    else:
        scales = zero_points = W1  # not read
        qmin, qmax, symmetric = 0.0, 0.0, True
    n, m = n_m if n_m is not None else (0, 1)
    try:
        _kernel()[(-(-rows // ROWS_PER_PROGRAM),)](
            W1, V1, scales, zero_points, held if held is not None else W1,
            d2 if d2 is not None else W1, integers, dequantized, diff,
            columns, rows, qmin, qmax,
            QUANTIZES=grid is not None, SYMMETRIC=symmetric,
            HOLDS_ZEROS=held is not None and n_m is None, KEEP=n, RUN=m,
            BLOCK=_next_power_of_2(columns), RUN_P2=max(_next_power_of_2(m), 2),
            ROWS=ROWS_PER_PROGRAM,
            enable_fp_fusion=False,  # each product rounded on its own, as the torch ops round it
        )  # fmt: skip
    except Exception as err:  # noqa: BLE001 - any compiler failure means: sweep with torch ops
        first_line = (str(err).strip().splitlines() or [""])[0][:200]
        _FALLBACK.give_up(
            f"the Triton sweep kernel failed to compile ({type(err).__name__}: {first_line})"
        )
        return False
    return True


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _triton_import_error() -> str | None:
    """Why `import triton` fails here, or None when it works (Python caches the import)."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return str(err)
    return None


@functools.cache
def _kernel() -> Any:
    """The kernel, made on first use, so that importing llmc-trace never imports Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def sweep(
        W, V, S, Z, HELD, D2, INTEGERS, DEQUANTIZED, DIFF,
        columns, rows, qmin, qmax,
        QUANTIZES: tl.constexpr, SYMMETRIC: tl.constexpr, HOLDS_ZEROS: tl.constexpr,
        KEEP: tl.constexpr, RUN: tl.constexpr,
        BLOCK: tl.constexpr, RUN_P2: tl.constexpr, ROWS: tl.constexpr,
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
        # N:M (KEEP > 0): the pruned weights chosen so far in this block, 1 where pruned
        chosen = tl.zeros((BLOCK, ROWS), dtype=tl.int32)
        in_run = tl.arange(0, RUN_P2)
        for i in range(0, columns):
            at = i * rows + row
            if KEEP > 0:
                if i % RUN == 0:
                    # each row's run of RUN columns scored as they stand now: w^2 / d^2
                    scores = tl.zeros((RUN_P2, ROWS), dtype=tl.float32)
                    for j in tl.static_range(RUN):
                        wj = tl.sum(tl.where(column[:, None] == i + j, tile, 0.0), axis=0)
                        d2 = tl.full((ROWS,), 0.0, tl.float32) + tl.load(D2 + i + j)
                        score = tl.math.div_rn(wj * wj, d2)
                        scores = tl.where(in_run[:, None] == j, score[None, :], scores)
                    for j in tl.static_range(RUN):
                        score = tl.sum(tl.where(in_run[:, None] == j, scores, 0.0), axis=0)
                        # its place in a stable ascending sort of the run
                        before = (scores < score[None, :]) | (
                            (scores == score[None, :]) & (in_run[:, None] < j)
                        )
                        before = before & (in_run[:, None] < RUN)
                        place = tl.sum(before.to(tl.int32), axis=0)
                        pruned = (place < RUN - KEEP).to(tl.int32)
                        chosen = tl.where(column[:, None] == i + j, pruned[None, :], chosen)
                        tl.store(HELD + (i + j) * rows + row, pruned.to(tl.int1), mask=row_in)
            # column i of the tile: the one nonzero term of each sum, so the value exactly
            w = tl.sum(tl.where(column[:, None] == i, tile, 0.0), axis=0)
            if KEEP > 0:
                held = tl.sum(tl.where(column[:, None] == i, chosen, 0), axis=0) != 0
            elif HOLDS_ZEROS:
                held = tl.load(HELD + at, mask=row_in, other=0) != 0
            else:
                held = row < 0
            if QUANTIZES:
                s = tl.load(S + at, mask=row_in, other=1.0)
                grid = tl.math.div_rn(w, s)
                if not SYMMETRIC:
                    z = tl.load(Z + at, mask=row_in, other=0.0)
                    grid = grid + z
                # adding and taking off 1.5 * 2^23 rounds a float32 below 2^22 in magnitude to
                # an integer, ties to even, as torch.round does (the sum keeps no bits below
                # the unit), in two additions the interpreter runs too; larger ones are clamped
                grid = tl.minimum(tl.maximum(grid, -4194304.0), 4194304.0)
                grid = (grid + 12582912.0) - 12582912.0
                grid = tl.minimum(tl.maximum(grid, qmin), qmax)
                if SYMMETRIC:
                    grid = tl.where(held, 0.0, grid)
                    q = grid * s
                else:
                    grid = tl.where(held, z, grid)
                    q = (grid - z) * s
                tl.store(INTEGERS + at, grid, mask=row_in)
            else:
                q = tl.where(held, 0.0, w)
            d = w - q
            tl.store(DEQUANTIZED + at, q, mask=row_in)
            tl.store(DIFF + at, d, mask=row_in)
            v = tl.load(V + i * columns + column, mask=column_in, other=0.0)
            tile = tile - v[:, None] * d[None, :]

    return sweep
