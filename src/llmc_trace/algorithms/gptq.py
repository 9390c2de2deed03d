"""GPTQ: quantize a linear layer's weight column by column, compensating each rounding error.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", 2022, https://arxiv.org/abs/2210.17323 (Algorithm 1, section 3),
optionally followed by coordinate-descent refinement of its integers (`llmc_trace.algorithms.refine`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.algorithms.baseline import DampedError, damped_error, rtn_damped_error
from llmc_trace.algorithms.grid import SweepGrid
from llmc_trace.algorithms.hessian import damping_diagonal, sweep_factor
from llmc_trace.algorithms.quantize import QuantizedWeight, rtn
from llmc_trace.algorithms.refine import Refinement, coordinate_descent
from llmc_trace.algorithms.scheme import QuantizationArgs
from llmc_trace.algorithms.sweep_kernel import kernel_sweeps, sweep_block
from llmc_trace.core.solver import DEFAULTS, SolverSettings


@dataclass(frozen=True)
class GPTQResult:
    """What `gptq` produced: the quantized weight, its predicted loss, and the damping used."""

    quantized: QuantizedWeight
    loss: float
    """||(W - Q) X^T||^2 / n_tokens + (damp / 2) ||W - Q||^2 for the inputs X that built H:
    the paper's objective (the sum over columns of err^2 / 2), after refinement if any."""
    percdamp: float
    """Damping that made H factorisable (the requested one unless it had to be raised)."""
    refinement: Refinement | None = None
    """What the coordinate descent after the sweep did; None when it was not asked for."""
    baseline_loss: float | None = None
    """Round-to-nearest's loss on the same terms (same H, same damping): what `damped_error`
    gives for `rtn`'s weight. None unless `baseline=True` asked for it."""


def gptq(
    W: torch.Tensor,
    H: torch.Tensor,
    args: QuantizationArgs,
    settings: SolverSettings = DEFAULTS,
    *,
    overwrite_hessian: bool = False,
    zeros: torch.Tensor | None = None,
    baseline: bool = False,
) -> GPTQResult:
    """Quantize `W` (out, in) to `args`' grid, minimising the layer's output error under `H`.

    `H` (in, in) is the mean of 2 x x^T over the layer's inputs (`HessianAccumulator.H`). The
    maths runs in float32 on `W`'s device; the result's scales and dequantized weight are in
    `W`'s dtype. `settings` (`SolverSettings`) holds the sweep's options: the damping
    `percdamp`, the block size `blocksize`, `refine_passes`, `static_groups`. Columns are
    visited in blocks of `blocksize`; within a block each column is
    rounded and its error spread over the block's remaining columns at once, while later blocks
    receive the block's accumulated error in one matmul (the paper's lazy batch updates). The
    error is spread through the Cholesky factor of H itself (`SweepFactor`), which gives the
    paper's updates without inverting H. On a GPU, with Triton, each block's column steps run
    as one kernel (`llmc_trace.algorithms.sweep_kernel`) when the grid's scales are fitted up
    front; the integers are those of the column loop. Where Triton is missing or cannot compile
    the kernel, the column loop runs, with one `KernelFallbackWarning`.

    `args.actorder` chooses the sweep order:

    * `None`: input order.
    * `"static"`: descending diag(H), so columns with the largest inputs are fixed first while
      the most columns remain to absorb their error. Groups stay the input-order runs of
      `group_size` columns (no `g_idx` in the checkpoint), so their scales are fitted up front.
    * `"group"`: the same order, and groups are runs of `group_size` columns *in that order*;
      the result carries `g_idx` mapping each input column to its group. compressed-tensors
      >= 0.20 and vLLM no longer load such checkpoints.

    `settings.static_groups=True` (the default) fits every group's scale up front from the original
    weights, as llm-compressor and AutoGPTQ's `static_groups` do; `False` fits each group when
    the sweep reaches its first column, from the weights as updated by the errors of all earlier
    columns, as the original GPTQ does. Up front is the default because it gave the lower
    total output error for symmetric grids on the reference model's layers: error compensation
    pushes the remaining weights beyond their original range, so a symmetric range refitted to
    them is coarser, while clipping to the original range is itself compensated by later
    columns. Asymmetric grids, which can move their zero point with the drift, go the other
    way; pass `SolverSettings(static_groups=False)` for them (`--no-static-groups`).
    `tests/algorithms/test_gptq.py` checks both directions. With `actorder="static"` groups are always fitted up front.

    `refine_passes` > 0 then runs `coordinate_descent` on the same objective, from the sweep's
    integers, for at most that many passes (it stops earlier when no integer can move; the
    reference model's layers settle in a few). It lowers this objective and the layers' error on
    held-out rows, yet not the model's perplexity on average over calibration draws (the
    README's "Compression results" give the figures `benchmarks/compress_quality.py` measures),
    so the default, 0, is the paper's GPTQ alone, as llm-compressor runs it.

    `overwrite_hessian=True` says the caller no longer needs `H`: its float32 storage is then
    reused for the factorisation (`sweep_factor`), one (in, in) matrix less at the peak, and
    its contents are undefined afterwards. Refinement needs `H` after the sweep, so with
    `refine_passes` `H` is kept anyway.

    `zeros` (out, in, bool) holds those weights at exactly zero: a model pruned by an earlier
    stage keeps its mask through quantization. Each is rounded to zero and its whole value is
    compensated by the columns after it, as SparseGPT compensates what it prunes; without the
    mask the sweep's updates would fill the pruned weights back in.

    `baseline=True` also measures round-to-nearest's loss (`GPTQResult.baseline_loss`), before
    `H` is overwritten, with the scales the sweep uses when they are `rtn`'s (fitted up front
    from input-order groups, as by default): a report then needs no second quantization of the
    layer.

    >>> from llmc_trace.algorithms import rtn
    >>> _ = torch.manual_seed(0)
    >>> W, X = torch.randn(8, 256), torch.randn(512, 256)  # weight (out, in), inputs (tokens, in)
    >>> result = gptq(W, 2 * X.T @ X / 512, QuantizationArgs(num_bits=4))
    >>> def output_error(Q):
    ...     return ((W - Q) @ X.T).pow(2).sum().item() / 512
    >>> output_error(result.quantized.weight) < output_error(rtn(W, result.quantized.args).weight)
    True
    >>> abs(result.loss / output_error(result.quantized.weight) - 1) < 0.05  # predicted loss
    True
    """
    refine_passes = settings.refine_passes
    dtype = W.dtype
    original = W
    W = W.to(torch.float32, copy=True)  # (out, in)
    H = H.to(W.device)
    overwrite = overwrite_hessian and not refine_passes
    perm = torch.argsort(torch.diag(H), descending=True) if args.actorder else None
    if perm is not None:
        permuted = H[perm[:, None], perm]
        H = H.copy_(permuted) if overwrite else permuted
        del permuted
        W = W[:, perm]
        zeros = zeros[:, perm] if zeros is not None else None
    _, dead = damping_diagonal(H)  # sweep_factor's dead columns, needed before it runs
    dead_weights = baseline and bool(W[:, dead].any())
    W[:, dead] = 0
    grid = SweepGrid(
        W, args, perm=perm, static_groups=settings.static_groups, scale_dtype=dtype, zeros=zeros
    )
    rtn_error = _rtn_error(original, W, H, grid, perm, dead_weights) if baseline else None
    factor = sweep_factor(H, settings.percdamp, overwrite=overwrite)
    blocksize = grid.aligned(settings.blocksize)

    rows, columns = W.shape
    in_one_launch = kernel_sweeps(grid, W.device)  # a block per kernel on a GPU
    G = W.zero_()  # (out, in): D_A R_A,: for the columns not reached yet (SweepFactor)
    del W
    loss = torch.zeros((), device=G.device)
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        before = factor.original_block(original, perm, i1, i2)  # (out, block)
        W1, U1, V1 = factor.reach_block(G, before, i1, i2)  # (block, out): row i = column i
        Q1 = torch.empty_like(W1)  # integers
        q1 = torch.empty_like(W1)  # their grid values
        diff1 = torch.empty_like(W1)  # w - q
        if not (in_one_launch and sweep_block(grid, i1, W1, V1, Q1, q1, diff1)):
            _sweep_columns(grid, i1, W1, V1, Q1, q1, diff1)
        grid.set_block(i1, Q1)
        loss += factor.leave_block(G, before, q1.T, diff1, U1, i1, i2)

    baseline_loss = rtn_error.loss(factor.percdamp) if rtn_error is not None else None
    if not refine_passes:
        return GPTQResult(
            grid.result(perm, dtype), loss.item(), factor.percdamp, baseline_loss=baseline_loss
        )
    # the descent needs the original weight and the damped H itself, not the sweep's state
    percdamp, dead = factor.percdamp, factor.dead
    del G, W1, diff1
    H_damped = factor.damped(H)
    del H, factor
    W = original.to(torch.float32, copy=True)
    if perm is not None:
        W = W[:, perm]
    W[:, dead] = 0
    refined = coordinate_descent(W, H_damped, grid, max_passes=refine_passes, blocksize=blocksize)
    return GPTQResult(grid.result(perm, dtype), refined.loss, percdamp, refined, baseline_loss)


def _sweep_columns(
    grid: SweepGrid,
    i1: int,
    W1: torch.Tensor,
    V1: torch.Tensor,
    Q1: torch.Tensor,
    q1: torch.Tensor,
    diff1: torch.Tensor,
) -> None:
    """The paper's steps over one block (`sweep_block`'s contract), a column at a time with
    torch ops: each column rounded (its group's scale fitted first where the sweep fits it)
    and its w - q spread over the block's later columns."""
    # views made once per block, so that the column loop allocates no tensor
    columns_of_block = zip(W1.unbind(), Q1.unbind(), q1.unbind(), diff1.unbind())
    for i, (w, integers, q, diff) in enumerate(columns_of_block):
        if grid.starts_group(i1 + i):
            group = W1[i : i + grid.group_size].T
            if grid.zeros is not None:  # the range the kept weights need
                held = grid.zeros[:, i1 + i : i1 + i + grid.group_size]
                group = group.masked_fill(held, 0)
            grid.fit(i1 + i, group)
        grid.quantize_into(i1 + i, w, integers, q)
        torch.sub(w, q, out=diff)
        W1[i:].addr_(V1[i, i:], diff, alpha=-1)  # rank-1, in place


def _rtn_error(
    original: torch.Tensor,
    W: torch.Tensor,
    H: torch.Tensor,
    grid: SweepGrid,
    perm: torch.Tensor | None,
    dead_weights: bool,
) -> DampedError:
    """Round-to-nearest's error on the sweep's terms (`W`, `H` and `grid` in sweep order).

    The grid's up-front scales are `rtn`'s unless they are fitted in the sweep, cover groups of
    sweep-order columns (`actorder="group"`), or were fitted without the nonzero weights of a
    dead column (`dead_weights`; GPTQ zeroes those columns first): then `rtn` runs afresh.
    """
    if grid.fits_in_sweep or grid.args.actorder == "group" or dead_weights:
        Q = rtn(original, grid.args).weight
        assert Q is not None  # a fresh result carries its dense weight
        return damped_error(W, Q if perm is None else Q[:, perm], H)
    return rtn_damped_error(W, H, grid)
