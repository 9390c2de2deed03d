"""AWQ's scales: protect the weight columns that meet the largest activations by scaling them up.

Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration"
(https://arxiv.org/abs/2306.00978), section 3.2: quantizing ``W diag(s)`` and dividing the
activations by ``s`` keeps the function and shrinks the relative rounding error of the columns
``s`` enlarges. The scales come from the activations' mean magnitude per channel ``x̄``
(with duo scaling also the weights' normalised mean magnitude ``w̄``):

    s = x̄^r / w̄^(1-r)   (or x̄^r)

normalised so that ``max(s) · min(s) = 1``, with the ratio ``r`` searched on a grid over
[0, 1): the one whose quantized layers' outputs, ``Q(W diag(s)) diag(s)⁻¹ X``, are closest to
the unquantized ``W X`` in mean squared error. ``r = 0`` without duo scaling is plain
round-to-nearest, so the search never does worse than it on the calibration data.

The error of a layer's outputs over the tokens is a quadratic form in its weight error
``E = Q(W diag(s)) diag(s)⁻¹ - W``: ``Σ_t |E x_t|² = tr(E G Eᵀ)`` with ``G = Σ_t x_t x_tᵀ``,
so the search needs the inputs' Gram matrix (``in × in``, what GPTQ's Hessian holds) instead
of the inputs themselves: memory that does not grow with the calibration set, and a search
``tokens / in`` times cheaper than replaying the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.algorithms.quantize import rtn
from llmc_trace.algorithms.scheme import QuantizationArgs

#: floor of a scale and of the means it is computed from
MIN_SCALE = 1e-4


@dataclass(frozen=True)
class AwqSearch:
    """The chosen scales and what the search measured: the output error with them and with
    none (``r = 0``, round-to-nearest), and the ratio and duo setting that won."""

    scales: torch.Tensor
    loss: float
    rtn_loss: float
    ratio: float
    duo: bool


def grid(n_grid: int, duo_scaling: bool | str) -> list[tuple[float, bool]]:
    """The (ratio, duo) points searched: ``n_grid`` ratios in [0, 1); with duo scaling, plain
    ``r = 0`` first (round-to-nearest) then the duo ratios; ``"both"`` half of each."""
    if duo_scaling == "both":
        half = max(n_grid // 2, 1)
        return [(i / half, duo) for i in range(half) for duo in (False, True)]
    if duo_scaling:
        return [(0.0, False)] + [(i / (n_grid - 1), True) for i in range(n_grid - 1)]
    return [(i / n_grid, False) for i in range(n_grid)]


def weight_means(weights: list[torch.Tensor], args: QuantizationArgs) -> torch.Tensor:
    """``w̄``: each column's mean magnitude over the balance layers' rows, every weight first
    divided by the largest magnitude of its quantization group."""
    total = None
    rows = 0
    for W in weights:
        width = W.shape[1]
        group = args.group_size if args.strategy == "group" and args.group_size else width
        grouped = W.float().abs().reshape(W.shape[0], width // group, group)
        normalised = (grouped / (grouped.amax(dim=-1, keepdim=True) + 1e-6)).reshape(W.shape)
        column_sum = normalised.sum(dim=0)
        total = column_sum if total is None else total + column_sum
        rows += W.shape[0]
    assert total is not None
    return total / rows


@torch.no_grad()
def awq_search(
    x_mean: torch.Tensor,
    G: torch.Tensor,
    tokens: int,
    weights: list[torch.Tensor],
    args: QuantizationArgs,
    *,
    n_grid: int = 20,
    duo_scaling: bool | str = True,
) -> AwqSearch:
    """The scales for balance layers ``weights`` (each ``(out, in)``) reading ``tokens``
    calibration inputs whose mean magnitude per channel is ``x_mean`` and whose Gram matrix is
    ``G`` (``(in, in)``): see the module docstring. The losses are mean squared errors per
    output value."""
    x_mean = x_mean.float()
    G = G.float()
    w_mean = weight_means(weights, args) if duo_scaling else None
    Ws = [W.float() for W in weights]
    values = tokens * sum(W.shape[0] for W in Ws)
    best: AwqSearch | None = None
    rtn_loss = float("nan")
    for ratio, duo in grid(n_grid, duo_scaling):
        if duo:
            assert w_mean is not None
            s = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + MIN_SCALE)).clamp(min=MIN_SCALE)
        else:
            s = x_mean.pow(ratio).clamp(min=MIN_SCALE)
        s = s / (s.max() * s.min()).sqrt()
        s = torch.where(torch.isfinite(s), s, torch.ones_like(s))
        loss = 0.0
        for W in Ws:
            Q = rtn(W * s[None, :], args).weight
            assert Q is not None
            E = Q / s[None, :] - W  # (out, in)
            loss += float(((E @ G) * E).sum())
        loss /= values
        if ratio == 0.0 and not duo:
            rtn_loss = loss
        if best is None or loss < best.loss:
            best = AwqSearch(s, loss, rtn_loss, ratio, duo)
    assert best is not None
    return AwqSearch(best.scales, best.loss, rtn_loss, best.ratio, best.duo)
