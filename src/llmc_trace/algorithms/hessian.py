"""Accumulate a layer's Hessian from its inputs and factor it for GPTQ's and SparseGPT's sweeps.

Both methods minimise ||W X - W' X||^2 over a layer's calibration inputs X; the second
derivative of that loss is H = 2 X^T X, which is all they need to know about the data. This
module holds the one implementation of the two steps they share: the streamed H, and the
Cholesky factor of the damped H that their column sweeps read from (`SweepFactor`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from llmc_trace.core.finite import non_finite
from llmc_trace.errors import HessianError

logger = logging.getLogger(__name__)


class HessianAccumulator:
    """The running mean H = 2 X^T X / n of a linear layer's inputs, n counting tokens.

    A running mean instead of a sum keeps memory at one (in, in) matrix whatever the number of
    samples, and keeps H's magnitude independent of n, so the relative damping in
    `sweep_factor` means the same for 16 samples as for 16,000. H is kept in float32 whatever
    the activation dtype: a bf16 sum over millions of tokens would stop growing once the terms
    fall below its 8-bit mantissa, and the Cholesky factorisation of a nearly singular H needs
    at least float32 to succeed.

    Counting tokens rather than sequences weighs every real token equally, so a batch of short,
    padded sequences counts for less than a batch of long ones; padding tokens, masked out, do
    not count at all.

    H is symmetric, so `add` computes only its lower triangle, a band of `BAND` columns per
    matrix product (about 60 % of the multiply-adds of the whole product, and what dominated
    calibration's Hessian time); the upper triangle is mirrored from it once, when `H` is next
    read, a band at a time. `problem` checks the computed entries without mirroring them.

    >>> acc = HessianAccumulator(4)
    >>> x = torch.randn(2, 3, 4)  # (batch, seq, in_features)
    >>> acc.add(x, mask=torch.tensor([[1, 1, 1], [1, 0, 0]]))
    >>> acc.num_tokens
    4
    >>> rows = torch.cat([x[0], x[1, :1]])
    >>> torch.testing.assert_close(acc.H, 2 * rows.T @ rows / 4)
    """

    BAND = 256
    """Columns of the lower triangle per matrix product: narrow enough that the products'
    wasted upper parts (one band-wide square each) stay small, wide enough to run at the
    matrix unit's full rate."""

    def __init__(self, in_features: int, device: torch.device | str = "cpu") -> None:
        self._H = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)
        self._mirrored = True
        self.num_tokens = 0

    @property
    def H(self) -> torch.Tensor:
        """The (in, in) float32 Hessian, symmetric (its upper triangle mirrored on demand)."""
        if not self._mirrored:
            _mirror_lower(self._H, self.BAND)
            self._mirrored = True
        return self._H

    def problem(self) -> str | None:
        """`non_finite` of the entries computed so far (the lower triangle and whatever was
        mirrored before), without mirroring: cheap enough to ask after every batch."""
        return non_finite(self._H)

    def add(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Fold the inputs `x` (..., in_features) into H.

        `mask` has `x`'s leading shape (e.g. the tokenizer's `attention_mask`, (batch, seq));
        tokens where it is 0 or False are left out.
        """
        H = self._H
        in_features = H.shape[0]
        if x.shape[-1] != in_features:
            raise ValueError(f"expected inputs with {in_features} features, got {tuple(x.shape)}")
        if mask is not None and not bool(mask.all()):  # indexing copies: only when padded
            x = x[mask.to(device=x.device, dtype=torch.bool)]
        sixteen_bit = x.dtype in (torch.bfloat16, torch.float16)
        x = x.reshape(-1, in_features).to(device=H.device, dtype=torch.float32)
        new_tokens = x.shape[0]
        if new_tokens == 0:
            return
        total = self.num_tokens + new_tokens
        beta, alpha = self.num_tokens / total, 2 / total
        # H <- H * n / (n + m) + (2 / (n + m)) x^T x on the lower triangle, band by band
        with _tensor_cores_when_exact(H.is_cuda and sixteen_bit):
            for a in range(0, in_features, self.BAND):
                b = min(a + self.BAND, in_features)
                H[a:, a:b].addmm_(x[:, a:].T, x[:, a:b], beta=beta, alpha=alpha)
        self._mirrored = False
        self.num_tokens = total


@contextlib.contextmanager
def _tensor_cores_when_exact(exact: bool) -> Iterator[None]:
    """Let CUDA's float32 matrix products run on the tensor cores in TF32 while `exact`: for
    activations that were bf16 or fp16 before their float32 copy. TF32 keeps 11 significant
    bits and float32's exponent range, so every bf16 (8 bits) and fp16 (11 bits) value is one
    exactly, their products are exact in float32, and the sums are float32's as before: the
    same H, from the matrix unit instead of the float32 pipes (about 8x the rate on an H200,
    where the 14336-wide down projection's Hessian was 60 % of an 8B model's calibration)."""
    if not exact:
        yield
        return
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


def _mirror_lower(H: torch.Tensor, band: int) -> None:
    """Copy `H`'s strict lower triangle onto its upper one in place, a band of rows at a time
    (the temporary is one band's transpose, never a second (in, in) matrix)."""
    n = H.shape[0]
    for a in range(0, n, band):
        b = min(a + band, n)
        H[a:b, b:] = H[b:, a:b].T
        block = H[a:b, a:b]
        block.copy_(torch.tril(block) + torch.tril(block, -1).T)


@dataclass(frozen=True)
class SweepFactor:
    """The Cholesky factor the column sweeps read, with the fixes made to get it.

    GPTQ (Algorithm 1 of the paper) reads U, the upper Cholesky factor of H_d^-1 (H_d: H
    damped), and llm-compressor computes it as written: a Cholesky factorisation of H_d, the
    inverse from it, and a Cholesky factorisation of that inverse, 4n^3/3 flops. The same U is
    the inverse of R, the upper triangular factor of H_d = R R^T (uniqueness of the Cholesky
    factor: H_d^-1 = R^-T R^-1), and R is the lower Cholesky factor of H_d with its rows and
    columns reversed: one factorisation, n^3/3 flops, and no inverse of the whole matrix.

    The sweeps need U only block by block. U's diagonal block on the columns B of a block is
    R_BB^-1 (a block-sized triangular inverse), and the paper's lazy updates of B by all
    earlier columns A, W_B - E_A U_AB, equal W_B + (D_A R_AB) R_BB^-1, with D = W - Q the
    weight changes made so far (W as before the sweep; E = D R is the paper's error matrix). So
    a sweep accumulates G = D_A R_AB for the columns not reached yet, one matrix product per
    finished block, and finds each block's weights as W_B + G_B R_BB^-1: within the block the
    paper's per-column steps with R_BB^-1, every decision (a group's scale, a pruning mask) on
    the very weights the paper's sweep decides on. `tests/algorithms/test_sweep_factor.py`
    checks the sweeps against the paper's, with U computed the paper's way in float64.
    """

    R: torch.Tensor  # (in, in) upper triangular, float32: H_d = R R^T
    dead: torch.Tensor  # (in,) bool: columns whose inputs were always zero
    percdamp: float  # damping actually used, as a fraction of mean(diag(H))
    damping: float  # the same damping as an absolute amount added to the diagonal

    def block_inverse(self, i1: int, i2: int) -> torch.Tensor:
        """U's diagonal block on columns `i1` to `i2`: R's block inverted, (block, block), row
        major (the solver returns it column major, and the sweeps read its rows)."""
        block = self.R[i1:i2, i1:i2]
        identity = torch.eye(i2 - i1, device=block.device, dtype=block.dtype)
        return torch.linalg.solve_triangular(block, identity, upper=True).contiguous()

    def reach_block(
        self, G: torch.Tensor, before: torch.Tensor, i1: int, i2: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The block of columns `i1` to `i2` as the paper's sweep finds it, W_B + G_B R_BB^-1,
        one row per column (block, out): each column's steps then read contiguous memory and
        its rank-1 update of the later columns is one contiguous run (about twice as fast as
        (out, block)). Also U's block, and its rows divided by their diagonal entry, which
        spread a column's w - q (so err = (w - q) / U_ii). `before` (out, block) is the block
        before the sweep, `G` (out, in) the sweep's accumulated D_A R_A,:."""
        U1 = self.block_inverse(i1, i2)
        W1 = torch.addmm(before.T, U1.T, G[:, i1:i2].T)
        return W1, U1, U1 / U1.diagonal()[:, None]

    def original_block(
        self, original: torch.Tensor, perm: torch.Tensor | None, i1: int, i2: int
    ) -> torch.Tensor:
        """Sweep positions `i1` to `i2` of the weight before the sweep, float32 (out, block):
        the columns of `original` (out, in) in sweep order (`perm`, None for input order),
        dead ones zeroed, as the sweep started from them."""
        if perm is None:
            block = original[:, i1:i2].to(torch.float32, copy=True)
        else:
            block = original[:, perm[i1:i2]].to(torch.float32)
        block[:, self.dead[i1:i2]] = 0
        return block

    def leave_block(
        self,
        G: torch.Tensor,
        before: torch.Tensor,
        chosen: torch.Tensor,
        diff: torch.Tensor,
        U1: torch.Tensor,
        i1: int,
        i2: int,
    ) -> torch.Tensor:
        """End the sweep's block `i1` to `i2`: its weight changes D_B = `before` - `chosen`
        (each (out, block)) reach the later columns, G += D_B R_B,:, and its share of the
        loss, the sum over its columns of err^2 / 2 with err = (w - q) / U_ii, is returned
        (a 0-d tensor). `before` and `diff` (w - q, (block, out)) are used up."""
        loss = diff.div_(U1.diagonal()[:, None]).pow_(2).sum() / 2
        if i2 < G.shape[1]:
            G[:, i2:].addmm_(before.sub_(chosen), self.R[i1:i2, i2:])
        return loss

    def damped(self, H: torch.Tensor) -> torch.Tensor:
        """The matrix the factor is of: `H` (not modified) with dead columns' diagonal set to
        1 and the damping added, in float32."""
        return _damped_copy(H, self.dead, self.damping)


def damping_diagonal(H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`H`'s diagonal in float32 with dead columns (diag(H) == 0: the input was always 0) set
    to 1, and the mask of those columns: the diagonal `sweep_factor` damps, whose mean scales
    `percdamp`. One definition, so a loss computed beside the solver
    (`llmc_trace.algorithms.baseline`) is damped exactly as the solver was."""
    diagonal = torch.diag(H).float()
    dead = diagonal == 0
    diagonal[dead] = 1
    return diagonal, dead


def sweep_factor(
    H: torch.Tensor, percdamp: float, *, max_attempts: int = 4, overwrite: bool = False
) -> SweepFactor:
    """Factor the damped `H` (in, in) for GPTQ's and SparseGPT's sweeps (`SweepFactor`).

    Dead columns (diag(H) == 0: the input was always 0) get H_ii = 1 so that H is invertible;
    the caller must zero those columns of W, which cannot affect the output. Damping adds
    `percdamp * mean(diag(H))` to the diagonal. If the factorisation fails (H numerically not
    positive definite), it is retried with ten times the damping, up to `max_attempts` in all;
    the damping that worked is returned and logged as a warning.

    The work happens in one (in, in) float32 matrix: a copy of `H` (left unmodified), or, with
    `overwrite=True` and a float32 `H`, `H` itself, which then *becomes* the returned `R`.
    Reversing rows and columns is done in place, a band of rows at a time, so besides that
    matrix only the Cholesky factor before it is copied back is alive: two (in, in) matrices at
    the peak when the caller gives `H` up, three when it keeps it. For a 28672-wide layer (a
    70B model's down projection) each is 3.3 GB.
    """
    if non_finite(H) is not None:
        raise HessianError(
            "the Hessian contains NaN or inf.",
            hint="check the layer's calibration inputs; a diverged forward pass produces them.",
        )
    diagonal, dead = damping_diagonal(H)
    mean_diag = diagonal.mean().item()  # dead columns count with H_ii = 1
    work = H if overwrite and H.dtype == torch.float32 else H.to(torch.float32, copy=True)
    _reverse(work)  # the lower factor of the reversed matrix is R reversed
    reversed_diagonal = diagonal.flip(0)
    for attempt in range(max_attempts):
        damp = percdamp * 10**attempt
        work.diagonal().copy_(reversed_diagonal + damp * mean_diag)
        L, info = torch.linalg.cholesky_ex(work)
        if info.item() != 0:
            continue  # only work's diagonal changed: the next attempt sets it again
        work.copy_(L)
        del L
        _reverse(work)  # R, upper triangular
        if attempt:
            logger.warning(
                "Hessian not positive definite with percdamp=%g; used percdamp=%g",
                percdamp,
                damp,
            )
        return SweepFactor(work, dead, damp, damp * mean_diag)
    raise HessianError(
        f"the Hessian could not be factorised even with "
        f"percdamp={percdamp * 10 ** (max_attempts - 1):g}.",
        hint="calibrate with more samples: the layer's inputs span too few directions.",
    )


REVERSE_BAND = 512
"""Rows swapped at once by `_reverse`: its temporary stays (512, in) however wide H is."""


def _reverse(M: torch.Tensor) -> None:
    """Reverse the order of `M`'s rows and of its columns (M[i, j] <- M[n-1-i, n-1-j]) in
    place: bands of rows from both ends swapped, each reversed, through one band's copy."""
    n = M.shape[0]
    half = n // 2
    for a in range(0, half, REVERSE_BAND):
        b = min(a + REVERSE_BAND, half)
        top, bottom = M[a:b], M[n - b : n - a]
        band = top.flip((0, 1))
        top.copy_(bottom.flip((0, 1)))
        bottom.copy_(band)
    if n % 2:
        M[half] = M[half].flip(0)


def _damped_copy(H: torch.Tensor, dead: torch.Tensor, added: float) -> torch.Tensor:
    """A float32 copy of `H` with dead columns' diagonal set to 1 and `added` on the diagonal."""
    damped = H.to(torch.float32, copy=True)
    damped.diagonal()[dead] = 1
    damped.diagonal().add_(added)
    return damped
