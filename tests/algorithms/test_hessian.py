"""The streamed Hessian and its damped inverse factor, against direct float64 computations."""

from __future__ import annotations

import logging

import pytest
import torch

from llmc_trace.algorithms import HessianAccumulator, HessianError, inverse_factor


def test_running_mean_equals_the_batch_hessian_whatever_the_batching() -> None:
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(3, 50, 16, generator=generator)  # (batch, seq, in)
    reference = 2 * X.reshape(-1, 16).double().T @ X.reshape(-1, 16).double() / 150

    one_pass, streamed = HessianAccumulator(16), HessianAccumulator(16)
    one_pass.add(X)
    for batch in X.split(1):
        for chunk in batch.split([7, 30, 13], dim=1):
            streamed.add(chunk)
    for acc in (one_pass, streamed):
        assert acc.num_tokens == 150 and acc.H.dtype == torch.float32
        torch.testing.assert_close(acc.H.double(), reference, rtol=1e-5, atol=1e-6)


def test_masked_padding_tokens_do_not_count() -> None:
    generator = torch.Generator().manual_seed(1)
    X = torch.randn(2, 8, 4, generator=generator)
    mask = torch.tensor([[1] * 8, [1] * 3 + [0] * 5])
    X_padded = X.clone()
    X_padded[1, 3:] = 1e3  # padding garbage that must not leak into H

    acc = HessianAccumulator(4)
    acc.add(X_padded.bfloat16(), mask=mask)
    real = torch.cat([X[0], X[1, :3]]).bfloat16().float()
    assert acc.num_tokens == 11
    torch.testing.assert_close(acc.H, 2 * real.T @ real / 11)


def test_inverse_factor_is_the_upper_cholesky_of_the_damped_inverse() -> None:
    generator = torch.Generator().manual_seed(2)
    X = torch.randn(64, 32, generator=generator)
    H = 2 * X.T @ X / 64
    H_before = H.clone()
    factor = inverse_factor(H, percdamp=0.01)

    damped = H.double() + 0.01 * torch.diag(H).mean().double() * torch.eye(32, dtype=torch.double)
    U = factor.H_inv.double()
    assert torch.equal(U, torch.triu(U)) and (torch.diag(U) > 0).all()
    torch.testing.assert_close(U.T @ U, torch.linalg.inv(damped), rtol=1e-4, atol=1e-5)
    assert factor.percdamp == 0.01 and not factor.dead.any()
    assert torch.equal(H, H_before)


def test_dead_columns_become_identity_rows() -> None:
    X = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    X[:, 5] = 0
    factor = inverse_factor(2 * X.T @ X / 64)
    assert factor.dead.tolist() == [i == 5 for i in range(8)]
    assert torch.isfinite(factor.H_inv).all()


def test_indefinite_hessian_is_retried_with_more_damping(caplog: pytest.LogCaptureFixture) -> None:
    # Eigenvalues -0.05 and 2.05: 1 % of the mean diagonal is not enough, 10 % is.
    H = torch.tensor([[1.0, 1.05], [1.05, 1.0]])
    with caplog.at_level(logging.WARNING, logger="llmc_trace.algorithms.hessian"):
        factor = inverse_factor(H, percdamp=0.01)
    assert factor.percdamp == pytest.approx(0.1)
    assert "percdamp=0.1" in caplog.text
    damped = H.double() + 0.1 * torch.eye(2, dtype=torch.double)
    torch.testing.assert_close(
        factor.H_inv.double().T @ factor.H_inv.double(), torch.linalg.inv(damped), rtol=1e-5, atol=0
    )


def test_overwriting_factorisation_reuses_the_hessian_and_gives_the_same_factor() -> None:
    """Given up by its caller, H's own storage becomes the factor (one matrix less at the
    peak), with the very numbers the copying factorisation gives; a failed first attempt
    (indefinite H) is still retried, from H's restored off-diagonal entries."""
    X = torch.randn(64, 32, generator=torch.Generator().manual_seed(4))
    X[:, 7] = 0
    for H in (2 * X.T @ X / 64, torch.tensor([[1.0, 1.05], [1.05, 1.0]])):
        kept = inverse_factor(H.clone(), percdamp=0.01)
        given_up = H.clone()
        factor = inverse_factor(given_up, percdamp=0.01, overwrite=True)
        assert factor.H_inv.data_ptr() == given_up.data_ptr()
        assert torch.equal(factor.H_inv, kept.H_inv) and torch.equal(factor.dead, kept.dead)
        assert factor.percdamp == kept.percdamp


@pytest.mark.parametrize("H", [torch.tensor([[1.0, 0.0], [0.0, float("nan")]]), -torch.eye(2)])
def test_unfactorisable_hessian_raises_with_a_hint(H: torch.Tensor) -> None:
    with pytest.raises(HessianError) as info:
        inverse_factor(H)
    assert info.value.hint
