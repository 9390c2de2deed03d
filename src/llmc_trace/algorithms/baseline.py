"""The loss a data-free baseline leaves on a layer, in the terms GPTQ and SparseGPT state theirs.

GPTQ's loss, the sum over columns of err^2 / 2, is exactly an output error: with R the upper
triangular factor of the damped Hessian (`SweepFactor`, H_d = R R^T), the sweep leaves
E = (W - Q) R, E holding the columns err, hence

    sum(err^2) / 2 = tr(E E^T) / 2 = tr((W - Q) H_d (W - Q)^T) / 2,

the error of the result under the *damped* Hessian H_d (`SweepFactor.damped`). SparseGPT's
sweep is the same, so its loss is that too; `tests/algorithms/test_baseline.py` checks both. The
comparable loss of round-to-nearest (or of magnitude pruning) is therefore tr(D H_d D^T) / 2 with
D = W - baseline(W), on the same H and the same damping: a layer's relative loss, method over
baseline, says how much of the baseline's error the method removed.

Dead columns (inputs always zero) count for neither: GPTQ zeroes them before its sweep, which
changes no output, and no error reaches them; here D is zero there, where H is zero anyway.

`damped_error` reads H before the method runs (GPTQ may overwrite it: `overwrite_hessian`)
and without a second (in, in) matrix; the damping term is added by `DampedError.loss` once
the damping the method actually used is known (it raises it when H does not factorise).
`gptq(..., baseline=True)` measures round-to-nearest's loss itself, with the scales its sweep
already fitted (`rtn_damped_error`), so the layer is not quantized a second time.

H is symmetric, so tr(D H D^T) needs only its lower block triangle: for column blocks a,

    tr(D H D^T) = sum_a <D_a, D_a H_aa + 2 D_{>a} H_{>a,a}>,

half the multiply-adds of D @ H, which was most of the baseline's time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from llmc_trace.algorithms.grid import SweepGrid
from llmc_trace.algorithms.hessian import damping_diagonal
from llmc_trace.algorithms.quantize import rtn
from llmc_trace.algorithms.scheme import QuantizationArgs
from llmc_trace.algorithms.sparsegpt import Sparsity, magnitude_prune

ROWS_PER_CHUNK = 1024
"""Rows of D formed at once: the temporaries stay (1024, in) however tall W is."""
COLUMNS_PER_BLOCK = 512
"""Width of the column blocks a of the symmetric product: wide enough for an efficient matrix
product, narrow enough that the (rows, 512) partial products stay small."""


@dataclass(frozen=True)
class DampedError:
    """The parts of tr(D H_d D^T) / 2 for one weight change D that the damping does not change."""

    undamped: float
    """tr(D H D^T) for H as accumulated (the mean of 2 x x^T: the output error per token)."""
    live_square: float
    """||D||^2 over the live columns: the damping adds `damping * live_square`."""
    mean_diagonal: float
    """mean(diag(H)) with dead columns counted as 1, what `sweep_factor` scales percdamp by."""

    def loss(self, percdamp: float) -> float:
        """tr(D H_d D^T) / 2 for H damped by `percdamp` (pass the one the method reports)."""
        return (self.undamped + percdamp * self.mean_diagonal * self.live_square) / 2


def damped_error(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> DampedError:
    """The error of replacing `W` (out, in) by `Q` under `H` (in, in), damping to be added.

    The arithmetic is float32 on `H`'s device, as the methods' own; `H` is not modified.

    >>> _ = torch.manual_seed(0)
    >>> W, X = torch.randn(8, 64), torch.randn(256, 64)
    >>> H = 2 * X.T @ X / 256
    >>> Q = rtn(W, QuantizationArgs(num_bits=3, group_size=32)).weight
    >>> D = W - Q
    >>> direct = (torch.trace(D @ H @ D.T) + 0.05 * H.diag().mean() * D.pow(2).sum()) / 2
    >>> abs(damped_error(W, Q, H).loss(0.05) / direct.item() - 1) < 1e-5
    True
    """
    chunks = zip(W.split(ROWS_PER_CHUNK), Q.split(ROWS_PER_CHUNK))
    return _damped_error((w.to(H.device, torch.float32) - q.to(H.device, torch.float32)
                          for w, q in chunks), H)  # fmt: skip


def rtn_damped_error(W: torch.Tensor, H: torch.Tensor, grid: SweepGrid) -> DampedError:
    """`damped_error` of round-to-nearest with `grid`'s scales, all arguments in sweep order.

    `W` (out, in) is float32, holding the values of `grid`'s dtype; `grid` has its scales
    fitted up front. Round-to-nearest with those scales is `rtn`'s result whenever they are
    `rtn`'s (the same weights, groups of input-order columns): then this is
    `damped_error(W, rtn(W, args).weight, H)` without fitting the scales again, forming the
    (out, in) integers, scales and weight, or converting between dtypes on the whole layer.
    Rows are rounded `ROWS_PER_CHUNK` at a time.
    """
    chunks = W.split(ROWS_PER_CHUNK)
    # w - nearest, formed in the rounded chunk itself: -q + w is exactly w - q
    return _damped_error(
        (grid.nearest(w, i * ROWS_PER_CHUNK).neg_().add_(w) for i, w in enumerate(chunks)), H
    )


def _damped_error(differences: Iterable[torch.Tensor], H: torch.Tensor) -> DampedError:
    """`damped_error` of the weight change D given as consecutive chunks of rows, float32."""
    diagonal, dead = damping_diagonal(H)
    undamped = live_square = 0.0  # summed in Python's double, one chunk at a time
    any_dead = bool(dead.any())
    for D in differences:  # (rows, in), contiguous
        if any_dead:
            D[:, dead] = 0
        undamped += _symmetric_quadratic(D, H).item()
        flat = D.reshape(-1)
        live_square += torch.dot(flat, flat).item()  # ||D||^2 with no squared copy
    return DampedError(undamped, live_square, diagonal.mean().item())


def _symmetric_quadratic(D: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
    """tr(D H D^T) for a symmetric `H` (in, in), from its lower block triangle (module doc)."""
    total = torch.zeros((), device=D.device)
    columns = H.shape[0]
    for a1 in range(0, columns, COLUMNS_PER_BLOCK):
        a2 = min(a1 + COLUMNS_PER_BLOCK, columns)
        D_a = D[:, a1:a2]
        P = D_a @ H[a1:a2, a1:a2]  # (rows, block)
        if a2 < columns:
            P.addmm_(D[:, a2:], H[a2:, a1:a2], alpha=2)
        total += (P * D_a).sum()
    return total


def baseline_weight(
    W: torch.Tensor, args: QuantizationArgs | None, sparsity: Sparsity | None = None
) -> torch.Tensor:
    """What the data-free baseline makes of `W` (out, in), in `W`'s dtype.

    Round-to-nearest on `args`' grid when quantizing; magnitude pruning to `sparsity` when
    pruning, then round-to-nearest of the kept weights when it quantizes too (pruned weights
    stay exactly zero). These are the `rtn` and `magnitude` methods of `compress`.
    """
    if sparsity is None:
        if args is None:
            raise ValueError("a baseline needs quantization args, a sparsity, or both")
        weight = rtn(W, args).weight
        assert weight is not None  # a fresh result carries its dense weight
        return weight
    pruned, mask = magnitude_prune(W, sparsity)
    if args is None:
        return pruned
    rounded = rtn(pruned, args).weight
    assert rounded is not None
    return rounded.masked_fill(mask, 0)
