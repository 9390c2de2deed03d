"""GPTQ's and SparseGPT's losses are their results' error under the damped Hessian, and the
baseline's loss computed without that matrix is the same error computed with it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _compress_data import hessian

from llmc_trace.algorithms import QuantizationArgs, gptq, inverse_factor, rtn, sparsegpt
from llmc_trace.algorithms.baseline import baseline_weight, damped_error
from llmc_trace.algorithms.sparsegpt import magnitude_prune

PERCDAMP = 0.1
"""Large enough that the damping term is a few percent of the loss, so leaving it out (or
adding it twice) is far outside the tolerance."""
DEAD = [5, 70, 71]
"""Input features that are always zero: their columns must count for nothing."""
RTOL = 1e-5


@pytest.fixture
def problem(correlated_inputs: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A (32, 128) weight and the Hessian of 512 correlated inputs with three dead features."""
    W = torch.randn(32, 128, generator=torch.Generator().manual_seed(1)) * 0.02
    X = correlated_inputs(512, 128, 1)
    X[:, DEAD] = 0
    return W, hessian(X)


def exact_damped_error(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor, percdamp: float) -> float:
    """tr(D H_d D^T) / 2 in float64 with H_d built as the solvers factor it, dead columns of D
    left out (the reference: every term written out, nothing folded)."""
    factor = inverse_factor(H, percdamp)
    H_d = factor.damped(H).double()
    D = (W - Q).double()
    D[:, factor.dead] = 0
    return (torch.trace(D @ H_d @ D.T) / 2).item()


def undamped_error(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> float:
    D = (W - Q).double()
    return (torch.trace(D @ H.double() @ D.T) / 2).item()


@pytest.mark.parametrize(
    ("args", "refine_passes"),
    [
        (QuantizationArgs(num_bits=4, group_size=32), 0),
        (QuantizationArgs(num_bits=3, symmetric=False, group_size=64), 0),
        (QuantizationArgs(num_bits=3, strategy="channel", group_size=None, actorder="static"), 0),
        (QuantizationArgs(num_bits=3, group_size=32), 3),
    ],
    ids=["w4-g32", "w3-asym-g64", "w3-channel-actorder", "w3-g32-refined"],
)
def test_gptq_loss_is_the_error_of_its_result_under_the_damped_hessian(
    problem: tuple[torch.Tensor, torch.Tensor], args: QuantizationArgs, refine_passes: int
) -> None:
    W, H = problem
    result = gptq(W, H, args, percdamp=PERCDAMP, refine_passes=refine_passes)
    Q = result.quantized.weight
    assert Q is not None and result.percdamp == PERCDAMP
    exact = exact_damped_error(W, Q, H, PERCDAMP)
    assert result.loss == pytest.approx(exact, rel=RTOL)
    # the damping is part of it: without it the error is smaller by far more than the tolerance
    assert undamped_error(W, Q, H) < exact * (1 - 100 * RTOL)
    assert damped_error(W, Q, H).loss(result.percdamp) == pytest.approx(exact, rel=RTOL)


@pytest.mark.parametrize(
    ("sparsity", "args"),
    [(0.5, None), ((2, 4), None), ((2, 4), QuantizationArgs(num_bits=4, group_size=32))],
    ids=["50%", "2:4", "2:4-w4"],
)
def test_sparsegpt_loss_is_the_error_of_its_result_under_the_damped_hessian(
    problem: tuple[torch.Tensor, torch.Tensor],
    sparsity: float | tuple[int, int],
    args: QuantizationArgs | None,
) -> None:
    W, H = problem
    result = sparsegpt(W, H, sparsity, quantize=args, percdamp=PERCDAMP)
    exact = exact_damped_error(W, result.weight, H, PERCDAMP)
    assert result.loss == pytest.approx(exact, rel=RTOL)
    assert undamped_error(W, result.weight, H) < exact * (1 - 100 * RTOL)


@pytest.mark.parametrize(
    ("args", "sparsity"),
    [
        (QuantizationArgs(num_bits=3, group_size=32), None),
        (None, (2, 4)),
        (QuantizationArgs(num_bits=4, group_size=32), 0.5),
    ],
    ids=["rtn-w3", "magnitude-2:4", "magnitude-50%-rtn-w4"],
)
def test_the_baseline_loss_without_the_damped_matrix_equals_the_exact_one(
    problem: tuple[torch.Tensor, torch.Tensor],
    args: QuantizationArgs | None,
    sparsity: float | tuple[int, int] | None,
) -> None:
    W, H = problem
    Q = baseline_weight(W, args, sparsity)
    exact = exact_damped_error(W, Q, H, PERCDAMP)
    assert damped_error(W, Q, H).loss(PERCDAMP) == pytest.approx(exact, rel=RTOL)
    assert not torch.equal(Q[:, DEAD], W[:, DEAD])  # the dead columns changed, and count nothing


def test_the_baseline_is_what_the_data_free_methods_make() -> None:
    W = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    args = QuantizationArgs(num_bits=4, group_size=32)
    assert torch.equal(baseline_weight(W, args), rtn(W, args).weight)
    pruned, mask = magnitude_prune(W, (2, 4))
    assert torch.equal(baseline_weight(W, None, (2, 4)), pruned)
    both = baseline_weight(W, args, (2, 4))
    assert (both[mask] == 0).all() and torch.equal(both[~mask], rtn(pruned, args).weight[~mask])


def test_gptq_and_sparsegpt_beat_their_baselines_on_the_same_terms(
    problem: tuple[torch.Tensor, torch.Tensor],
) -> None:
    W, H = problem
    args = QuantizationArgs(num_bits=3, group_size=32)
    quantized = gptq(W, H, args, percdamp=PERCDAMP)
    assert quantized.loss < 0.8 * damped_error(W, baseline_weight(W, args), H).loss(PERCDAMP)
    pruned = sparsegpt(W, H, 0.5, percdamp=PERCDAMP)
    magnitude = damped_error(W, baseline_weight(W, None, 0.5), H).loss(PERCDAMP)
    assert pruned.loss < 0.8 * magnitude
