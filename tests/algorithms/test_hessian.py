"""The streamed Hessian and the factor the sweeps read, against direct float64 computations."""

from __future__ import annotations

import logging

import pytest
import torch

from llmc_trace.algorithms import HessianAccumulator, HessianError, sweep_factor
from llmc_trace.algorithms.hessian import _reverse


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


def test_the_lower_triangle_bands_and_their_mirror_give_the_whole_product() -> None:
    """Wider than three bands (not a multiple of one), streamed in batches, H is the full
    symmetric product, exactly symmetric; a NaN in a later batch is seen without mirroring."""
    width = 2 * HessianAccumulator.BAND + 77
    X = torch.randn(4, 40, width, generator=torch.Generator().manual_seed(5))
    acc = HessianAccumulator(width)
    for batch in X:
        acc.add(batch)
    rows = X.reshape(-1, width).double()
    torch.testing.assert_close(acc.H.double(), 2 * rows.T @ rows / 160, rtol=1e-5, atol=1e-5)
    assert torch.equal(acc.H, acc.H.T)
    poisoned = X[0].clone()
    poisoned[3, width - 1] = float("nan")
    acc.add(poisoned)
    assert acc.problem() is not None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sixteen_bit_inputs_give_the_exact_products_on_the_tensor_cores() -> None:
    """bf16 and fp16 activations are accumulated with TF32 tensor cores, which hold each of
    their values exactly: H is the float64 product of the same values up to float32 sums.
    Float32 inputs, which TF32 would round, keep the float32 pipes."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = (torch.randn(4, 512, 384, generator=generator) * 3).to(dtype)
        exact = x.reshape(-1, 384).double()
        reference = 2 * exact.T @ exact / exact.shape[0]
        accumulator = HessianAccumulator(384, device="cuda")
        accumulator.add(x.cuda())
        error = (accumulator.H.double().cpu() - reference).abs().max() / reference.abs().max()
        assert error < 1e-6, (dtype, error.item())
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"  # put back as it was


def damped_hessian(H: torch.Tensor, percdamp: float) -> torch.Tensor:
    """H with percdamp * mean(diag(H)) on its diagonal, in float64."""
    return H.double() + percdamp * torch.diag(H).mean().double() * torch.eye(
        H.shape[0], dtype=torch.double
    )


def paper_factor(damped: torch.Tensor) -> torch.Tensor:
    """What GPTQ's paper reads: the upper Cholesky factor of the damped inverse, float64."""
    return torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)


def test_sweep_factor_is_the_cholesky_factor_of_the_damped_hessian() -> None:
    """R is upper triangular with R R^T = H_d, and its inverse is the paper's factor U, whose
    diagonal blocks the sweeps read."""
    generator = torch.Generator().manual_seed(2)
    X = torch.randn(64, 32, generator=generator)
    H = 2 * X.T @ X / 64
    H_before = H.clone()
    factor = sweep_factor(H, percdamp=0.01)

    damped = damped_hessian(H, 0.01)
    R = factor.R.double()
    assert torch.equal(factor.R, torch.triu(factor.R)) and (torch.diag(R) > 0).all()
    torch.testing.assert_close(R @ R.T, damped, rtol=1e-5, atol=1e-5)
    U = paper_factor(damped)
    torch.testing.assert_close(torch.linalg.inv(R), U, rtol=1e-4, atol=1e-5)
    for i1, i2 in ((0, 12), (12, 32)):
        block = factor.block_inverse(i1, i2).double()
        torch.testing.assert_close(block, U[i1:i2, i1:i2], rtol=1e-4, atol=1e-5)
    assert factor.percdamp == 0.01 and not factor.dead.any()
    assert torch.equal(H, H_before)


@pytest.mark.parametrize("width", [7, 8, 1025])
def test_reversing_in_place_reverses_rows_and_columns(width: int) -> None:
    """Odd and even widths, and one wider than two bands of rows."""
    M = torch.randn(width, width, generator=torch.Generator().manual_seed(width))
    expected = M.flip((0, 1))
    _reverse(M)
    assert torch.equal(M, expected)


def test_dead_columns_become_identity_rows() -> None:
    X = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    X[:, 5] = 0
    factor = sweep_factor(2 * X.T @ X / 64, 0.01)
    assert factor.dead.tolist() == [i == 5 for i in range(8)]
    assert torch.isfinite(factor.R).all()


def test_indefinite_hessian_is_retried_with_more_damping(caplog: pytest.LogCaptureFixture) -> None:
    # Eigenvalues -0.05 and 2.05: 1 % of the mean diagonal is not enough, 10 % is.
    H = torch.tensor([[1.0, 1.05], [1.05, 1.0]])
    with caplog.at_level(logging.WARNING, logger="llmc_trace.algorithms.hessian"):
        factor = sweep_factor(H, percdamp=0.01)
    assert factor.percdamp == pytest.approx(0.1)
    assert "percdamp=0.1" in caplog.text
    R = factor.R.double()
    torch.testing.assert_close(R @ R.T, damped_hessian(H, 0.1), rtol=1e-5, atol=0)


def test_overwriting_factorisation_reuses_the_hessian_and_gives_the_same_factor() -> None:
    """Given up by its caller, H's own storage becomes the factor (one matrix less at the
    peak), with the very numbers the copying factorisation gives; a failed first attempt
    (indefinite H) is still retried, from H's restored off-diagonal entries."""
    X = torch.randn(64, 32, generator=torch.Generator().manual_seed(4))
    X[:, 7] = 0
    for H in (2 * X.T @ X / 64, torch.tensor([[1.0, 1.05], [1.05, 1.0]])):
        kept = sweep_factor(H.clone(), percdamp=0.01)
        given_up = H.clone()
        factor = sweep_factor(given_up, percdamp=0.01, overwrite=True)
        assert factor.R.data_ptr() == given_up.data_ptr()
        assert torch.equal(factor.R, kept.R)
        assert torch.equal(factor.dead, kept.dead) and factor.percdamp == kept.percdamp


@pytest.mark.parametrize("H", [torch.tensor([[1.0, 0.0], [0.0, float("nan")]]), -torch.eye(2)])
def test_unfactorisable_hessian_raises_with_a_hint(H: torch.Tensor) -> None:
    with pytest.raises(HessianError) as info:
        sweep_factor(H, 0.01)
    assert info.value.hint
