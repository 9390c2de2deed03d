"""Refine a quantized weight by coordinate descent until no single integer can move nearer.

GPTQ visits each column once: a column is rounded knowing the errors of the columns before it,
never those of the columns after it, so its choice is greedy. Coordinate descent on the same
objective revisits every weight with all the others held fixed (Behdin, Acharya, Gupta, Keerthi,
Mazumder, "QuantEase: Optimization-based Quantization for Language Models", 2023,
https://arxiv.org/abs/2309.01885, section 3). Started from GPTQ's integers, each move can only
lower the layer's error, and the descent ends at a point where no single weight has a better
grid point: a local minimum that GPTQ's own result is in general not.

The objective is GPTQ's, f(Q) = tr((W - Q) H (W - Q)^T) for the damped H that GPTQ factorised,
and it separates over rows. With R = (W - Q) H, the best value of column j for fixed other
columns is q_j + R_j / H_jj; the best grid point is the one nearest it (f is a parabola in each
coordinate), and a move of column j by dq changes R by -dq H_j. Moves are made on the grid GPTQ
fitted (scales and zero points are not touched), so the checkpoint format is unchanged.

The damping stays in the objective: the descent continues exactly what GPTQ minimised, so its
loss is comparable with GPTQ's, and the damping is a ridge that keeps each weight near its
original value where the calibration inputs say little about it.

`llmc_trace.algorithms.gptq.gptq` says what this did and did not do on the reference model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.algorithms.grid import SweepGrid

MAX_PASSES = 20
"""Default limit on passes; the reference model's layers reach a point where no integer can
move in 3 to 10, so the limit only bounds the time of a layer that would not settle."""


@dataclass(frozen=True)
class Refinement:
    """What `coordinate_descent` did."""

    passes: int
    """Passes over the weight that moved at least one integer."""
    converged: bool
    """Whether it stopped because no integer could move (else it ran out of passes)."""
    loss: float
    """tr((W - Q) H (W - Q)^T) / 2 when it stopped: GPTQ's loss on the same terms."""


def coordinate_descent(
    W: torch.Tensor,
    H: torch.Tensor,
    grid: SweepGrid,
    *,
    max_passes: int = MAX_PASSES,
    blocksize: int,
) -> Refinement:
    """Move the integers of `grid` while any single move lowers tr((W - Q) H (W - Q)^T).

    `W` (out, in) is the original weight in float32 and `H` (in, in) the damped Hessian, both in
    the grid's sweep order; `grid` holds the starting integers and is updated in place. Each pass
    first finds, in one vectorised step, the columns where some row has a strictly nearer grid
    point, then visits just those in sweep order, `blocksize` at a time: within a block each
    column sees its predecessors' moves at once, and the rest of R receives the block's moves in
    one matrix product, as in GPTQ's lazy batch updates. Later passes touch a few columns only,
    so a pass costs far less than the first. Stops when no column can move, or after
    `max_passes` passes.

    >>> from llmc_trace.algorithms.scheme import QuantizationArgs
    >>> _ = torch.manual_seed(0)
    >>> W, X = torch.randn(16, 64), torch.randn(256, 64)
    >>> H = 2 * X.T @ X / 256
    >>> grid = SweepGrid(W, QuantizationArgs(num_bits=3, group_size=32), perm=None, static_groups=True,
    ...                  scale_dtype=torch.float32)
    >>> for j in range(64):  # start from round-to-nearest
    ...     _ = grid.set(j, grid.nearer(torch.tensor([j]), W[:, j : j + 1])[:, 0])
    >>> def loss():
    ...     E = W - grid.dequantized(torch.arange(64))
    ...     return (E @ H * E).sum().item() / 2
    >>> before = loss()
    >>> result = coordinate_descent(W, H, grid, blocksize=32)
    >>> result.converged, result.loss < before, abs(result.loss / loss() - 1) < 1e-4
    (True, True, True)
    """
    out_features, in_features = W.shape
    d = torch.diagonal(H)
    R = torch.zeros(out_features, in_features, dtype=torch.float32, device=W.device)
    for block in _blocks(torch.arange(in_features, device=W.device), blocksize):
        R.addmm_(W[:, block] - grid.dequantized(block), H[block, :])

    passes = 0
    while True:
        movable = _movable(R, d, grid, blocksize)
        converged = movable.numel() == 0
        if converged or passes == max_passes:
            break
        passes += 1
        for block in _blocks(movable, blocksize):
            _descend(R, H, d, grid, block)

    loss = torch.zeros((), device=W.device)
    for block in _blocks(torch.arange(in_features, device=W.device), blocksize):
        loss += ((W[:, block] - grid.dequantized(block)) * R[:, block]).sum()
    return Refinement(passes, converged, loss.item() / 2)


def _blocks(columns: torch.Tensor, size: int) -> list[torch.Tensor]:
    return list(torch.split(columns, size))


def _movable(R: torch.Tensor, d: torch.Tensor, grid: SweepGrid, chunk: int) -> torch.Tensor:
    """Sweep positions where some row has a grid point strictly nearer its best value."""
    found = []
    for block in _blocks(torch.arange(R.shape[1], device=R.device), chunk):
        target = grid.dequantized(block) + R[:, block] / d[block]
        moves = grid.nearer(block, target) != grid.int_weight[:, block].float()
        found.append(block[moves.any(dim=0)])
    return torch.cat(found)


def _descend(
    R: torch.Tensor, H: torch.Tensor, d: torch.Tensor, grid: SweepGrid, block: torch.Tensor
) -> None:
    """Visit the sweep positions `block` in order, moving each column to its best grid point."""
    R_block = R[:, block]  # a copy: kept current within the block
    H_block = H[block][:, block]
    moves = torch.zeros_like(R_block)
    for i, column in enumerate(block.tolist()):
        position = block[i : i + 1]
        current = grid.dequantized(position)[:, 0]
        target = current + R_block[:, i] / d[column]
        moved = grid.set(column, grid.nearer(position, target[:, None])[:, 0]) - current
        moves[:, i] = moved
        R_block.sub_(moved[:, None] * H_block[i][None, :])
    R.addmm_(moves, H[block, :], alpha=-1)
