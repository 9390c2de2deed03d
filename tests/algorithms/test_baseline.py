"""GPTQ's and SparseGPT's losses are their results' error under the damped Hessian, and the
baseline's loss computed without that matrix is the same error computed with it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _compress_data import LayerInputs, hessian

from llmc_trace.algorithms import QuantizationArgs, gptq, sweep_factor, rtn, sparsegpt
from llmc_trace.core.solver import SolverSettings
from llmc_trace.algorithms.baseline import DampedError, baseline_weight, damped_error
from llmc_trace.algorithms.hessian import damping_diagonal
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
    factor = sweep_factor(H, percdamp)
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
    result = gptq(
        W, H, args, settings=SolverSettings(percdamp=PERCDAMP, refine_passes=refine_passes)
    )
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
    result = sparsegpt(W, H, sparsity, quantize=args, settings=SolverSettings(percdamp=PERCDAMP))
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
    quantized = gptq(W, H, args, settings=SolverSettings(percdamp=PERCDAMP))
    assert quantized.loss < 0.8 * damped_error(W, baseline_weight(W, args), H).loss(PERCDAMP)
    pruned = sparsegpt(W, H, 0.5, settings=SolverSettings(percdamp=PERCDAMP))
    magnitude = damped_error(W, baseline_weight(W, None, 0.5), H).loss(PERCDAMP)
    assert pruned.loss < 0.8 * magnitude


def damped_error_before(W: torch.Tensor, Q: torch.Tensor, H: torch.Tensor) -> DampedError:
    """`damped_error` as of commit 4b67272: D @ H in full, 1024 rows at a time."""
    D = W.to(H.device, torch.float32) - Q.to(H.device, torch.float32)
    diagonal, dead = damping_diagonal(H)
    D[:, dead] = 0
    undamped = sum(((rows @ H) * rows).sum().item() for rows in D.split(1024))
    return DampedError(float(undamped), D.pow(2).sum().item(), diagonal.mean().item())


def test_the_half_product_equals_the_full_one(
    correlated_inputs: Callable[..., torch.Tensor],
) -> None:
    """Taller than a chunk of rows, wider than a block of columns (and not a multiple of it),
    with dead features: the symmetric half product gives the old full product's numbers."""
    X = correlated_inputs(2048, 600, 3)
    X[:, [0, 300, 599]] = 0
    H = hessian(X)
    W = torch.randn(1100, 600, generator=torch.Generator().manual_seed(3)) * 0.02
    for Q in (rtn(W, QuantizationArgs(num_bits=3, group_size=40)).weight, W.round()):
        new, old = damped_error(W, Q, H), damped_error_before(W, Q, H)
        assert new.undamped == pytest.approx(old.undamped, rel=RTOL)
        assert new.live_square == pytest.approx(old.live_square, rel=RTOL)
        assert new.mean_diagonal == old.mean_diagonal


BASELINE_CASES = {
    "w4a16-static-bf16": (QuantizationArgs(num_bits=4, group_size=32, actorder="static"),
                          torch.bfloat16, True),
    "w3-g32": (QuantizationArgs(num_bits=3, group_size=32), torch.float32, True),
    "w4-asym-mse-fp16": (QuantizationArgs(num_bits=4, group_size=64, symmetric=False,
                                          observer="mse"), torch.float16, True),
    "w8-channel-static": (QuantizationArgs(num_bits=8, strategy="channel", group_size=None,
                                           actorder="static"), torch.float32, True),
    "w4-tensor": (QuantizationArgs(num_bits=4, strategy="tensor", group_size=None),
                  torch.float32, True),
    "w4-group-order": (QuantizationArgs(num_bits=4, group_size=32, actorder="group"),
                       torch.float32, True),
    "w3-asym-in-sweep": (QuantizationArgs(num_bits=3, group_size=32, symmetric=False),
                         torch.float32, False),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BASELINE_CASES))
@pytest.mark.parametrize("overwrite", [False, True], ids=["kept", "overwritten"])
def test_gptq_measures_the_rtn_baseline_as_the_report_did(
    problem: tuple[torch.Tensor, torch.Tensor], case: str, overwrite: bool
) -> None:
    """`gptq(baseline=True)` gives the loss the report computed from a second `rtn` of the layer
    and `damped_error` before: the same scales reused (or rtn run afresh where they are not
    rtn's), the same damping, the same number to float32 rounding."""
    args, dtype, static_groups = BASELINE_CASES[case]
    W, H = problem
    W = W.to(dtype)
    before = damped_error_before(W, baseline_weight(W, args), H)
    result = gptq(
        W, H.clone(), args, SolverSettings(percdamp=PERCDAMP, static_groups=static_groups),
        overwrite_hessian=overwrite, baseline=True,
    )  # fmt: skip
    assert result.baseline_loss == pytest.approx(before.loss(result.percdamp), rel=RTOL)
    assert gptq(W, H, args, settings=SolverSettings(percdamp=PERCDAMP)).baseline_loss is None


def test_the_rtn_baseline_counts_dead_columns_weights_in_its_scales(
    problem: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """The dead columns' weights widen rtn's ranges though their inputs are always zero; GPTQ
    fits its grid without them, so its scales are not rtn's there and rtn runs afresh."""
    W, H = problem
    W = W.clone()
    W[:, DEAD] = 1.0  # far outside the other weights: rtn's groups with them get coarse
    args = QuantizationArgs(num_bits=4, group_size=32)
    before = damped_error_before(W, baseline_weight(W, args), H).loss(PERCDAMP)
    result = gptq(W, H, args, baseline=True, settings=SolverSettings(percdamp=PERCDAMP))
    assert result.baseline_loss == pytest.approx(before, rel=RTOL)
    live = W.masked_fill(W == 1.0, 0)
    tight = damped_error_before(live, baseline_weight(live, args), H).loss(PERCDAMP)
    assert tight < 0.5 * before  # the case is one where the scales matter


def test_the_rtn_baseline_on_a_refmodel_layer(down_proj: LayerInputs) -> None:
    """Real activations (SwiGLU outlier channels), the default scheme's act-order."""
    H = hessian(down_proj.X_calib)
    W = down_proj.W.to(torch.bfloat16)
    args = QuantizationArgs(num_bits=4, actorder="static")
    before = damped_error_before(W, baseline_weight(W, args), H)
    result = gptq(W, H.clone(), args, overwrite_hessian=True, baseline=True)
    assert result.baseline_loss == pytest.approx(before.loss(result.percdamp), rel=RTOL)


@pytest.mark.parametrize(
    "args",
    [
        QuantizationArgs(num_bits=4, strategy="tensor", group_size=None),
        QuantizationArgs(num_bits=4, strategy="channel", group_size=None, actorder="static"),
        QuantizationArgs(num_bits=4, group_size=32, symmetric=False, actorder="static"),
    ],
    ids=["tensor", "channel", "group"],
)
def test_the_rtn_baseline_of_a_weight_taller_than_a_chunk(
    problem: tuple[torch.Tensor, torch.Tensor], args: QuantizationArgs
) -> None:
    """Rows are rounded a chunk at a time: each chunk must read its own rows' scales."""
    W, H = problem
    W = torch.cat([W * (1 + i) for i in range(40)])  # (1280, 128): rows' ranges all differ
    before = damped_error_before(W, baseline_weight(W, args), H)
    result = gptq(W, H, args, baseline=True, settings=SolverSettings(percdamp=PERCDAMP))
    assert result.baseline_loss == pytest.approx(before.loss(result.percdamp), rel=RTOL)
