"""The sweeps through `SweepFactor` make the paper's choices, and the rounding is bit for bit.

`gptq_paper` and `sparsegpt_paper` are the sweeps as GPTQ's and SparseGPT's papers (and
llm-compressor) write them: the upper Cholesky factor U of the damped inverse, here computed in
float64 (`paper_factor`), each column's error err = (w - q) / U_ii spread by U's row, one column
at a time with its own temporaries (the per-column code of commit 4b67272). The sweeps now
spread errors through the Cholesky factor of H itself, never inverting it: the same
arithmetic in exact numbers, so in float32 they must choose the same integers, masks and
scales wherever float rounding does not tip a weight across a rounding boundary (GPTQ carries
such a tip along the rest of its row), and the same loss. `lowest_before` is the old sort the
mask selection replaced; `per_column_before` the old spreading of scales to every column, which
`quantize_to_int` and `dequantize` no longer gather: those two are compared bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _compress_data import hessian

from llmc_trace.algorithms import QuantizationArgs, gptq, sparsegpt
from llmc_trace.core.solver import SolverSettings
from llmc_trace.algorithms.grid import SweepGrid
from llmc_trace.algorithms.hessian import damping_diagonal
from llmc_trace.algorithms.quantize import (
    QuantizedWeight,
    compute_qparams,
    dequantize,
    quantize_to_int,
    round_to_grid,
)
from llmc_trace.algorithms.sparsegpt import Sparsity, _check_sparsity, _lowest, _n_m_mask


def lowest_before(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The pruning mask of commit 4b67272: the first `count` of a stable argsort."""
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[torch.argsort(scores.flatten(), stable=True)[:count]] = True
    return mask.reshape(scores.shape)


def quantize_column(grid: SweepGrid, column: int, w: torch.Tensor) -> torch.Tensor:
    """The per-column rounding of commit 4b67272's `SweepGrid.quantize`."""
    s, z = grid.qparams(torch.tensor([column]))
    integers = round_to_grid(w, s[:, 0], z[:, 0], grid.args)
    if grid.zeros is not None:
        integers = torch.where(grid.zeros[:, column], z[:, 0], integers)
    return grid.set(column, integers)


def paper_factor(H: torch.Tensor, percdamp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """U, the upper Cholesky factor of the damped inverse as the papers compute it (Cholesky,
    inverse, Cholesky), in float64 and returned in float32; and the dead columns."""
    diagonal, dead = damping_diagonal(H)
    damped = H.double().clone()
    damped.diagonal().copy_(diagonal.double() + percdamp * diagonal.double().mean())
    inverse = torch.cholesky_inverse(torch.linalg.cholesky(damped))
    return torch.linalg.cholesky(inverse, upper=True).float(), dead


def gptq_paper(
    W: torch.Tensor,
    H: torch.Tensor,
    args: QuantizationArgs,
    *,
    static_groups: bool = True,
    zeros: torch.Tensor | None = None,
) -> tuple[QuantizedWeight, float]:
    """GPTQ's sweep as the paper writes it (blocksize 128, percdamp 0.01, no refinement)."""
    dtype = W.dtype
    W = W.to(torch.float32, copy=True)
    perm = torch.argsort(torch.diag(H), descending=True) if args.actorder else None
    if perm is not None:
        H = H[perm[:, None], perm]
        W = W[:, perm]
        zeros = zeros[:, perm] if zeros is not None else None
    H_inv, dead = paper_factor(H)
    W[:, dead] = 0
    grid = SweepGrid(
        W, args, perm=perm, static_groups=static_groups, scale_dtype=dtype, zeros=zeros
    )
    blocksize = grid.aligned(128)
    columns = W.shape[1]
    loss = torch.zeros(())
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = H_inv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w = W1[:, i]
            d = Hinv1[i, i]
            if grid.starts_group(i1 + i):
                group = W1[:, i : i + grid.group_size]
                if zeros is not None:
                    group = group.masked_fill(zeros[:, i1 + i : i1 + i + grid.group_size], 0)
                grid.fit(i1 + i, group)
            err = (w - quantize_column(grid, i1 + i, w)) / d
            W1[:, i:].addr_(err, Hinv1[i, i:], alpha=-1)
            Err1[:, i] = err
        loss += Err1.pow(2).sum() / 2
        W[:, i2:] -= Err1 @ H_inv[i1:i2, i2:]
    return grid.result(perm, dtype), loss.item()


def sparsegpt_paper(
    W: torch.Tensor, H: torch.Tensor, sparsity: Sparsity, quantize: QuantizationArgs | None
) -> tuple[torch.Tensor, torch.Tensor, QuantizedWeight | None, float]:
    """SparseGPT's sweep as the paper writes it (blocksize 128, percdamp 0.01)."""
    dtype = W.dtype
    W = W.to(torch.float32, copy=True)
    rows, columns = W.shape
    nm = _check_sparsity(sparsity, columns)
    H_inv, dead = paper_factor(H)
    W[:, dead] = 0
    grid, blocksize = None, 128
    if quantize is not None:
        grid = SweepGrid(W, quantize, perm=None, static_groups=False, scale_dtype=dtype)
        blocksize = grid.aligned(blocksize, nm[1] if nm else 1)
    elif nm is not None:
        blocksize = max(blocksize // nm[1], 1) * nm[1]
    Q = torch.zeros_like(W)
    pruned = torch.zeros_like(W, dtype=torch.bool)
    loss = torch.zeros(())
    for i1 in range(0, columns, blocksize):
        i2 = min(i1 + blocksize, columns)
        W1 = W[:, i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        Hinv1 = H_inv[i1:i2, i1:i2]
        mask1 = torch.zeros_like(W1, dtype=torch.bool)
        if nm is None:
            assert not isinstance(sparsity, tuple)
            count = round(sparsity * rows * i2) - round(sparsity * rows * i1)
            mask1 = lowest_before(W1**2 / torch.diag(Hinv1).reshape(1, -1) ** 2, count)
        for i in range(i2 - i1):
            w = W1[:, i]
            d = Hinv1[i, i]
            if nm is not None and i % nm[1] == 0:
                scores = W1[:, i : i + nm[1]] ** 2 / torch.diag(Hinv1)[i : i + nm[1]] ** 2
                mask1[:, i : i + nm[1]] = _n_m_mask(scores, *nm)
            q = w.masked_fill(mask1[:, i], 0)
            if grid is not None:
                if grid.starts_group(i1 + i):
                    group = slice(i, i + grid.group_size)
                    grid.fit(i1 + i, W1[:, group].masked_fill(mask1[:, group], 0))
                q = quantize_column(grid, i1 + i, q)
            Q1[:, i] = q
            loss += (w - q).pow(2).sum() / d**2 / 2
            err = (w - q) / d
            W1[:, i:].addr_(err, Hinv1[i, i:], alpha=-1)
            Err1[:, i] = err
        Q[:, i1:i2] = Q1
        pruned[:, i1:i2] = mask1
        W[:, i2:] -= Err1 @ H_inv[i1:i2, i2:]
    quantized = grid.result(None, dtype) if grid is not None else None
    weight = Q.to(dtype) if quantized is None else quantized.weight
    assert weight is not None
    return weight, pruned, quantized, loss.item()


AGREEMENT = 0.999
"""Share of integers (and mask entries) that must equal the paper's: float rounding tips a
weight across a rounding boundary about once in 10^4 here, and GPTQ carries the tip along
its row; a wrong update disagrees on a quarter or more."""


LOSS_AGREEMENT = 1e-2
"""Relative gap allowed between the sweep's predicted loss and the paper's: equal up to float
rounding (1e-6) where the integers are all equal, and about 1e-3 where a tip is carried along a
row (seen with one thread on an AVX512 CPU; which weight tips depends on the machine's
summation order). Without the updates (round to nearest) the loss is 2.7-10x the sweep's."""


def assert_agrees(new: QuantizedWeight, paper: QuantizedWeight) -> None:
    """The same integers but for float-rounding tips, and the same scales but for the groups
    a tip reached before their scale was fitted (a search observer then picks another)."""
    assert (new.int_weight == paper.int_weight).float().mean().item() >= AGREEMENT
    close = torch.isclose(new.scale.float(), paper.scale.float(), rtol=1e-3, atol=0)
    assert close.float().mean().item() >= 0.99
    assert (new.g_idx is None) == (paper.g_idx is None)
    if new.g_idx is not None and paper.g_idx is not None:
        assert torch.equal(new.g_idx, paper.g_idx)


@pytest.fixture
def problem(correlated_inputs: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A (96, 448) weight (448: three full blocks and a partial one) and correlated inputs'
    Hessian with a dead feature."""
    W = torch.randn(96, 448, generator=torch.Generator().manual_seed(2)) * 0.02
    X = correlated_inputs(1024, 448, 2)
    X[:, 7] = 0
    return W, hessian(X)


GPTQ_CASES = {
    "w4-g64-static": (
        QuantizationArgs(num_bits=4, group_size=64, actorder="static"), True, torch.float32
    ),
    "w4-g32-bf16": (QuantizationArgs(num_bits=4, group_size=32), True, torch.bfloat16),
    "w3-asym-in-sweep": (
        QuantizationArgs(num_bits=3, symmetric=False, group_size=32), False, torch.float32
    ),
    "w3-mse-in-sweep": (
        QuantizationArgs(num_bits=3, group_size=64, observer="mse"), False, torch.float32
    ),
    "w4-group-order": (QuantizationArgs(num_bits=4, actorder="group", group_size=64), True,
                       torch.float32),
    "w8-channel": (QuantizationArgs(num_bits=8, strategy="channel", group_size=None), True,
                   torch.float16),
    "w4-tensor-asym": (
        QuantizationArgs(num_bits=4, strategy="tensor", group_size=None, symmetric=False),
        True,
        torch.float32,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GPTQ_CASES))
def test_gptq_sweep_makes_the_papers_choices(
    problem: tuple[torch.Tensor, torch.Tensor], case: str
) -> None:
    args, static_groups, dtype = GPTQ_CASES[case]
    W, H = problem
    W = W.to(dtype)
    new = gptq(W, H, args, SolverSettings(static_groups=static_groups))
    paper, paper_loss = gptq_paper(W, H, args, static_groups=static_groups)
    assert_agrees(new.quantized, paper)
    assert new.loss == pytest.approx(paper_loss, rel=LOSS_AGREEMENT)


def test_gptq_sweep_keeping_zeros_makes_the_papers_choices(
    problem: tuple[torch.Tensor, torch.Tensor],
) -> None:
    W, H = problem
    W = W.masked_fill(W.abs() < 0.01, 0)  # an earlier stage's pruning
    for args in (QuantizationArgs(num_bits=4, group_size=64, actorder="static"),
                 QuantizationArgs(num_bits=3, symmetric=False, group_size=32)):  # fmt: skip
        new = gptq(W, H, args, SolverSettings(static_groups=False), zeros=W == 0)
        paper, paper_loss = gptq_paper(W, H, args, static_groups=False, zeros=W == 0)
        assert_agrees(new.quantized, paper)
        assert new.loss == pytest.approx(paper_loss, rel=LOSS_AGREEMENT)
        assert new.quantized.weight is not None
        assert (new.quantized.weight[W == 0] == 0).all()


SPARSEGPT_CASES = {
    "50%": (0.5, None),
    "2:4": ((2, 4), None),
    "50%-w4-asym": (0.5, QuantizationArgs(num_bits=4, symmetric=False, group_size=32)),
    "2:4-w3-mse": ((2, 4), QuantizationArgs(num_bits=3, group_size=64, observer="mse")),
}


@pytest.mark.parametrize("case", list(SPARSEGPT_CASES))
def test_sparsegpt_sweep_makes_the_papers_choices(
    problem: tuple[torch.Tensor, torch.Tensor], case: str
) -> None:
    sparsity, args = SPARSEGPT_CASES[case]
    W, H = problem
    new = sparsegpt(W, H, sparsity, quantize=args)
    weight, pruned, quantized, loss = sparsegpt_paper(W, H, sparsity, args)
    assert (new.pruned == pruned).float().mean().item() >= AGREEMENT
    assert (new.weight[new.pruned] == 0).all()
    if quantized is not None:
        assert new.quantized is not None
        assert_agrees(new.quantized, quantized)
    else:  # the kept weights are the updated ones: equal up to float rounding
        torch.testing.assert_close(new.weight, weight, rtol=0, atol=1e-5)
    assert new.loss == pytest.approx(loss, rel=LOSS_AGREEMENT)


def test_the_selection_prunes_what_the_stable_sort_pruned() -> None:
    """Ties at the threshold (many equal scores, zeros) are broken by position, as the sort's
    order broke them, for every count from none to all."""
    generator = torch.Generator().manual_seed(4)
    for scores in (
        torch.randint(0, 5, (7, 9), generator=generator).float(),  # ties everywhere
        torch.randn(12, 16, generator=generator) ** 2,
        torch.zeros(3, 4),
    ):
        for count in range(scores.numel() + 1):
            assert torch.equal(_lowest(scores, count), lowest_before(scores, count))


def per_column_before(
    qparam: torch.Tensor, args: QuantizationArgs, in_features: int, g_idx: torch.Tensor | None
) -> torch.Tensor:
    """commit 4b67272's spreading of a scale or zero point to every column."""
    if args.strategy == "tensor":
        return qparam.reshape(1, 1)
    if args.strategy == "channel":
        return qparam
    if g_idx is None:
        g_idx = torch.arange(in_features) // args.group_size
    return qparam[:, g_idx.long()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rounding_by_group_views_is_bit_identical_to_the_gathered_one(dtype: torch.dtype) -> None:
    """`quantize_to_int` and `dequantize` broadcast scales over (out, groups, group_size) views
    instead of gathering them to every column; the numbers must not change."""
    W = (torch.randn(24, 96, generator=torch.Generator().manual_seed(5)) * 0.05).to(dtype)
    for args in (
        QuantizationArgs(num_bits=4, group_size=32),
        QuantizationArgs(num_bits=3, group_size=32, symmetric=False),
        QuantizationArgs(num_bits=4, strategy="channel", group_size=None),
        QuantizationArgs(num_bits=8, strategy="tensor", group_size=None, symmetric=False),
    ):
        scale, zero_point = compute_qparams(W, args)
        s, z = (per_column_before(t, args, 96, None) for t in (scale, zero_point))
        integers = round_to_grid(W, s, z, args).to(torch.int8)
        assert torch.equal(quantize_to_int(W, scale, zero_point, args), integers)
        weight = ((integers.float() - z.float()) * s.float()).to(dtype)
        assert torch.equal(dequantize(integers, scale, zero_point, args, dtype=dtype), weight)
    g_idx = torch.randint(0, 3, (96,), generator=torch.Generator().manual_seed(6))
    args = QuantizationArgs(num_bits=4, group_size=32, actorder="group")
    scale, zero_point = compute_qparams(W, QuantizationArgs(num_bits=4, group_size=32))
    s, z = (per_column_before(t, args, 96, g_idx) for t in (scale, zero_point))
    integers = round_to_grid(W, s, z, args).to(torch.int8)
    assert torch.equal(quantize_to_int(W, scale, zero_point, args, g_idx), integers)
