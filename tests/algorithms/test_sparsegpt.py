"""SparseGPT: exact sparsity and pattern, better than magnitude pruning, masks kept through quantization."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _compress_data import LayerInputs, hessian, output_error

from llmc_trace.algorithms import (
    QuantizationArgs,
    SchemeError,
    dequantize,
    magnitude_prune,
    quantize_to_int,
    rtn,
    sparsegpt,
)
from llmc_trace.core.solver import SolverSettings


def holds_n_m(weight: torch.Tensor, n: int, m: int) -> bool:
    """Whether every run of m consecutive inputs of every row has at most n non-zeros."""
    return bool(((weight.reshape(weight.shape[0], -1, m) != 0).sum(-1) <= n).all())


@pytest.fixture
def problem(correlated_inputs: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    W = torch.randn(96, 384, generator=torch.Generator().manual_seed(1)) * 0.02
    return W, correlated_inputs(2048, 384, 1)


@pytest.mark.parametrize("sparsity", [0.5, 0.3, 0.7])
def test_unstructured_sparsity_is_exact(
    problem: tuple[torch.Tensor, torch.Tensor], sparsity: float
) -> None:
    W, X = problem
    result = sparsegpt(W, hessian(X), sparsity)
    assert int(result.pruned.sum()) == round(sparsity * W.numel())
    assert (result.weight[result.pruned] == 0).all()
    assert (result.weight[~result.pruned] != 0).all()
    assert result.quantized is None


def test_two_four_pattern_holds(problem: tuple[torch.Tensor, torch.Tensor]) -> None:
    W, X = problem
    result = sparsegpt(W, hessian(X), (2, 4))
    runs = result.pruned.reshape(W.shape[0], -1, 4)
    assert (runs.sum(-1) == 2).all()
    assert holds_n_m(result.weight, 2, 4)


@pytest.mark.parametrize("sparsity", [0.5, (2, 4)], ids=["50%", "2:4"])
def test_sparsegpt_beats_magnitude_pruning(
    problem: tuple[torch.Tensor, torch.Tensor], sparsity: float | tuple[int, int]
) -> None:
    W, X = problem
    pruned = sparsegpt(W, hessian(X), sparsity).weight
    baseline, _ = magnitude_prune(W, sparsity)
    assert output_error(W, pruned, X) < 0.8 * output_error(W, baseline, X)


@pytest.mark.parametrize("sparsity", [0.5, (2, 4)], ids=["50%", "2:4"])
def test_sparsegpt_beats_magnitude_on_a_refmodel_layer(
    down_proj: LayerInputs, sparsity: float | tuple[int, int]
) -> None:
    W = down_proj.W
    pruned = sparsegpt(W, hessian(down_proj.X_calib), sparsity).weight
    baseline, _ = magnitude_prune(W, sparsity)
    for X in (down_proj.X_calib, down_proj.X_eval):
        assert output_error(W, pruned, X) < 0.8 * output_error(W, baseline, X)


@pytest.mark.parametrize("sparsity", [0.5, (2, 4)], ids=["50%", "2:4"])
@pytest.mark.parametrize(
    "args",
    [QuantizationArgs(num_bits=4), QuantizationArgs(num_bits=4, symmetric=False, group_size=64)],
    ids=["w4a16", "w4a16-asym-g64"],
)
def test_sparse_and_quantized_keeps_the_mask_exactly(
    problem: tuple[torch.Tensor, torch.Tensor],
    sparsity: float | tuple[int, int],
    args: QuantizationArgs,
) -> None:
    W, X = problem
    H = hessian(X)
    result = sparsegpt(W, H, sparsity, quantize=args)
    q = result.quantized
    assert q is not None and torch.equal(q.weight, result.weight)
    assert (result.weight[result.pruned] == 0).all()
    assert args.group_size is not None
    zero_points = q.zero_point.repeat_interleave(args.group_size, dim=1)
    assert torch.equal(q.int_weight[result.pruned], zero_points[result.pruned])
    assert torch.equal(dequantize(q.int_weight, q.scale, q.zero_point, args), q.weight)
    assert torch.equal(quantize_to_int(q.weight, q.scale, q.zero_point, args), q.int_weight)
    if isinstance(sparsity, tuple):
        assert holds_n_m(result.weight, *sparsity)
    # Compensating the rounding error in the same sweep beats rounding the pruned weights after.
    rounded_after = rtn(sparsegpt(W, H, sparsity).weight, args).weight
    # measured 0.62-0.74x over these cases: a margin float order cannot cross
    assert output_error(W, result.weight, X) < 0.85 * output_error(W, rounded_after, X)


def test_predicted_loss_equals_the_damped_quadratic(
    problem: tuple[torch.Tensor, torch.Tensor],
) -> None:
    W, X = problem
    H = hessian(X)
    result = sparsegpt(W, H, 0.5, settings=SolverSettings(percdamp=0.01))
    delta = (W - result.weight).double()
    H_damped = H.double() + 0.01 * torch.diag(H).mean().double() * torch.eye(
        384, dtype=torch.double
    )
    assert result.loss == pytest.approx(
        0.5 * torch.trace(delta @ H_damped @ delta.T).item(), rel=1e-3
    )


def test_magnitude_prune_removes_the_smallest_weights(
    problem: tuple[torch.Tensor, torch.Tensor],
) -> None:
    W, _ = problem
    weight, pruned = magnitude_prune(W, 0.6)
    assert int(pruned.sum()) == round(0.6 * W.numel())
    assert W[pruned].abs().max() <= W[~pruned].abs().min()
    assert torch.equal(weight, W.masked_fill(pruned, 0))
    weight, pruned = magnitude_prune(W, (2, 4))
    assert holds_n_m(weight, 2, 4)
    runs, kept = W.abs().reshape(96, -1, 4), ~pruned.reshape(96, -1, 4)
    smallest_kept = runs.masked_fill(~kept, torch.inf).amin(-1)
    largest_pruned = runs.masked_fill(kept, -torch.inf).amax(-1)
    assert (largest_pruned <= smallest_kept).all()


@pytest.mark.parametrize("sparsity", [1.0, -0.1, (4, 4), (0, 4), (2, 5)])
def test_invalid_sparsity_raises_with_a_hint(
    problem: tuple[torch.Tensor, torch.Tensor], sparsity: float | tuple[int, int]
) -> None:
    W, X = problem
    with pytest.raises(SchemeError) as info:
        sparsegpt(W, hessian(X), sparsity)
    assert info.value.hint


def test_act_order_is_refused_with_a_hint(problem: tuple[torch.Tensor, torch.Tensor]) -> None:
    W, X = problem
    with pytest.raises(SchemeError, match="actorder"):
        sparsegpt(W, hessian(X), 0.5, quantize=QuantizationArgs(actorder="static"))
