"""Accumulate a layer's Hessian from its inputs and factor its damped inverse, for GPTQ and SparseGPT.

Both methods minimise ||W X - W' X||^2 over a layer's calibration inputs X; the second
derivative of that loss is H = 2 X^T X, which is all they need to know about the data. This
module holds the one implementation of the two steps they share: the streamed H, and the upper
Cholesky factor of the damped inverse that their column sweeps read from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from llmc_trace.core.finite import non_finite
from llmc_trace.errors import HessianError

logger = logging.getLogger(__name__)


class HessianAccumulator:
    """The running mean H = 2 X^T X / n of a linear layer's inputs, n counting tokens.

    A running mean instead of a sum keeps memory at one (in, in) matrix whatever the number of
    samples, and keeps H's magnitude independent of n, so the relative damping in
    `inverse_factor` means the same for 16 samples as for 16,000. H is kept in float32 whatever
    the activation dtype: a bf16 sum over millions of tokens would stop growing once the terms
    fall below its 8-bit mantissa, and the Cholesky factorisation of a nearly singular H needs
    at least float32 to succeed.

    Counting tokens rather than sequences weighs every real token equally, so a batch of short,
    padded sequences counts for less than a batch of long ones; padding tokens, masked out, do
    not count at all.

    >>> acc = HessianAccumulator(4)
    >>> x = torch.randn(2, 3, 4)  # (batch, seq, in_features)
    >>> acc.add(x, mask=torch.tensor([[1, 1, 1], [1, 0, 0]]))
    >>> acc.num_tokens
    4
    >>> rows = torch.cat([x[0], x[1, :1]])
    >>> torch.testing.assert_close(acc.H, 2 * rows.T @ rows / 4)
    """

    def __init__(self, in_features: int, device: torch.device | str = "cpu") -> None:
        self.H = torch.zeros(in_features, in_features, dtype=torch.float32, device=device)
        self.num_tokens = 0

    def add(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Fold the inputs `x` (..., in_features) into H.

        `mask` has `x`'s leading shape (e.g. the tokenizer's `attention_mask`, (batch, seq));
        tokens where it is 0 or False are left out.
        """
        in_features = self.H.shape[0]
        if x.shape[-1] != in_features:
            raise ValueError(f"expected inputs with {in_features} features, got {tuple(x.shape)}")
        if mask is not None and not bool(mask.all()):  # indexing copies: only when padded
            x = x[mask.to(device=x.device, dtype=torch.bool)]
        x = x.reshape(-1, in_features).to(device=self.H.device, dtype=torch.float32)
        new_tokens = x.shape[0]
        if new_tokens == 0:
            return
        total = self.num_tokens + new_tokens
        # H <- H * n / (n + m) + (2 / (n + m)) x^T x, as one in-place matrix product
        self.H.addmm_(x.T, x, beta=self.num_tokens / total, alpha=2 / total)
        self.num_tokens = total


@dataclass(frozen=True)
class InverseFactor:
    """The upper Cholesky factor of (H + damp I)^-1, with the fixes made to get it.

    GPTQ and SparseGPT read row i of `H_inv` when they fix column i: its diagonal entry is the
    scale of column i's error and the rest of the row spreads that error over later columns.
    """

    H_inv: torch.Tensor  # (in, in) upper triangular, float32
    dead: torch.Tensor  # (in,) bool: columns whose inputs were always zero
    percdamp: float  # damping actually used, as a fraction of mean(diag(H))
    damping: float  # the same damping as an absolute amount added to the diagonal

    def damped(self, H: torch.Tensor) -> torch.Tensor:
        """The matrix whose inverse `H_inv` factors: `H` (not modified) with dead columns'
        diagonal set to 1 and the damping added, in float32."""
        return _damped_copy(H, self.dead, self.damping)


def damping_diagonal(H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`H`'s diagonal in float32 with dead columns (diag(H) == 0: the input was always 0) set
    to 1, and the mask of those columns: the diagonal `inverse_factor` damps, whose mean scales
    `percdamp`. One definition, so a loss computed beside the solver
    (`llmc_trace.algorithms.baseline`) is damped exactly as the solver was."""
    diagonal = torch.diag(H).float()
    dead = diagonal == 0
    diagonal[dead] = 1
    return diagonal, dead


def inverse_factor(
    H: torch.Tensor, percdamp: float = 0.01, *, max_attempts: int = 4, overwrite: bool = False
) -> InverseFactor:
    """Factor the damped inverse of `H` (in, in) as in GPTQ's `fasterquant`.

    Dead columns (diag(H) == 0: the input was always 0) get H_ii = 1 so that H is invertible;
    the caller must zero those columns of W, which cannot affect the output. Damping adds
    `percdamp * mean(diag(H))` to the diagonal, then H^-1 = cholesky_inverse(cholesky(H)) and its
    upper Cholesky factor is taken. If a factorisation fails (H numerically not positive
    definite), it is retried with ten times the damping, up to `max_attempts` in all; the
    damping that worked is returned and logged as a warning.

    The work happens in one (in, in) float32 matrix: a copy of `H` (left unmodified), or, with
    `overwrite=True` and a float32 `H`, `H` itself, which then *becomes* the returned `H_inv`.
    Every step writes in place, so besides that matrix at most one more is alive (the
    Cholesky factor before it is copied back, or LAPACK's workspace): two (in, in) matrices at
    the peak when the caller gives `H` up, three when it keeps it. For a 28672-wide layer
    (a 70B model's down projection) each is 3.3 GB. With `overwrite`, a failure after the
    first factorisation (the inverse not positive definite in float32, rare once H factorised)
    cannot be retried, since H is gone, and raises.
    """
    if non_finite(H) is not None:
        raise HessianError(
            "the Hessian contains NaN or inf.",
            hint="check the layer's calibration inputs; a diverged forward pass produces them.",
        )
    diagonal, dead = damping_diagonal(H)
    mean_diag = diagonal.mean().item()  # dead columns count with H_ii = 1
    work = H if overwrite and H.dtype == torch.float32 else None
    for attempt in range(max_attempts):
        damp = percdamp * 10**attempt
        if work is None:
            work = H.to(torch.float32, copy=True)
        work.diagonal().copy_(diagonal + damp * mean_diag)
        L, info = torch.linalg.cholesky_ex(work)
        if info.item() != 0:
            continue  # only work's diagonal changed: the next attempt sets it again
        work.copy_(L)
        del L
        torch.cholesky_inverse(work, out=work)
        info = torch.empty((), dtype=torch.int32, device=work.device)
        torch.linalg.cholesky_ex(work, upper=True, out=(work, info))
        if info.item() == 0:
            if attempt:
                logger.warning(
                    "Hessian not positive definite with percdamp=%g; used percdamp=%g",
                    percdamp,
                    damp,
                )
            return InverseFactor(work, dead, damp, damp * mean_diag)
        if work is H:
            raise HessianError(
                f"the inverse of the Hessian damped with percdamp={damp:g} is not positive "
                "definite in float32.",
                hint="calibrate with more samples: the layer's inputs span too few directions.",
            )
        work = None  # it holds the failed factor now: the next attempt copies H again
    raise HessianError(
        f"the Hessian could not be factorised even with "
        f"percdamp={percdamp * 10 ** (max_attempts - 1):g}.",
        hint="calibrate with more samples: the layer's inputs span too few directions.",
    )


def _damped_copy(H: torch.Tensor, dead: torch.Tensor, added: float) -> torch.Tensor:
    """A float32 copy of `H` with dead columns' diagonal set to 1 and `added` on the diagonal."""
    damped = H.to(torch.float32, copy=True)
    damped.diagonal()[dead] = 1
    damped.diagonal().add_(added)
    return damped
