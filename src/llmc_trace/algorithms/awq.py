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

After the scales are folded, AWQ clips (section 3.3 of the paper; ``apply_clip`` in the
authors' code): each quantization group of each output row is clamped to
``±shrink · max|w|`` before rounding, ``shrink`` on the grid ``1, 0.95, ...`` cutting less
than ``max_shrink`` (the authors' 20 steps and 0.5: down to 0.55). Giving up the few largest
weights of a group buys a finer grid for all the others; :func:`awq_clip` picks the shrinks
that minimise the same output error ``tr(E G Eᵀ)``, ``G`` now the Gram matrix of the folded
layer's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.algorithms.quantize import channel_args, rtn
from llmc_trace.algorithms.scheme import QuantizationArgs

#: floor of a scale and of the means it is computed from
MIN_SCALE = 1e-4
#: clipping's grid: shrinks ``1 - i / CLIP_GRID`` (AWQ's 20 steps of 5 %)
CLIP_GRID = 20
#: at most this many coordinate-descent sweeps over a row's groups (see :func:`awq_clip`)
CLIP_SWEEPS = 2


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


@dataclass(frozen=True)
class AwqClip:
    """The clamped weight (``W``'s dtype and shape, still to be rounded), each group's shrink
    (``(out, groups)``), and the output error per row (``mean_r e_r G e_rᵀ``) of rounding it
    and of rounding the unclipped weight."""

    weight: torch.Tensor
    shrinks: torch.Tensor
    loss: float
    unclipped_loss: float


def clip_shrinks(max_shrink: float) -> list[float]:
    """The shrinks tried: ``1`` (no clipping) first, then down in steps of ``1 / CLIP_GRID``
    while the range is cut by less than ``max_shrink``."""
    return [1 - i / CLIP_GRID for i in range(max(int(round(max_shrink * CLIP_GRID)), 1))]


def clippable(args: QuantizationArgs) -> bool:
    """Whether ``args`` has a range per row and group to shrink: an integer grid with groups
    or one scale per output channel (a tensor-wide or block scale is shared across rows)."""
    return not args.is_float and args.strategy in ("group", "channel")


@torch.no_grad()
def awq_clip(
    W: torch.Tensor, G: torch.Tensor, args: QuantizationArgs, *, max_shrink: float = 0.5
) -> AwqClip:
    """Clip ``W`` (``(out, in)``, as folded) for rounding with ``args``, given its inputs' Gram
    matrix ``G`` (``(in, in)``; divided by the tokens, the losses are mean squared errors per
    output value).

    Row ``r``'s output error is ``e_r G e_rᵀ`` with ``e_r`` its whole rounding error, so a
    group's shrink also moves the error cross terms ``e_g G_gh e_hᵀ`` with the row's other
    groups. AWQ's authors minimise each group's own term ``e_g G_gg e_gᵀ`` (the output of the
    group's slice alone, block-diagonal ``G``) and ignore the cross terms, so a choice can
    raise the layer's actual output error. Here the objective is the exact one: coordinate
    descent over the groups, each taking the shrink that minimises the row's whole error with
    the others fixed (``e_g G_gg e_gᵀ + 2 e_g·b_g``, ``b_g`` the cross terms, read from
    ``C = E G``, which each change updates by ``Δe_g G_g:``). It starts from no clipping and
    every step keeps or lowers the error, so the result is never worse than rounding the
    unclipped weight. The first sweep is AWQ's choice with the cross terms counted; the second
    lets the early groups answer the later ones' changes (it moves the error by well under a
    percent, a third by nothing measurable), so it stops after ``CLIP_SWEEPS`` or a sweep that
    changes nothing.
    A sweep costs ``out · in · (shrinks · group + in)`` multiply-adds, about two evaluations
    of :func:`awq_search`'s loss. With one scale per channel the row is one group and the
    descent is a single exact choice. Rounding runs in ``W``'s dtype, so the clamped weight
    then rounds (:func:`~llmc_trace.algorithms.quantize.rtn`) to exactly the candidate chosen.
    """
    if not clippable(args):
        raise ValueError(f"clipping needs a range per row and group, not {args.strategy}")
    out, width = W.shape
    group = args.group_size if args.strategy == "group" and args.group_size else width
    columns = [slice(start, start + group) for start in range(0, width, group)]
    one_scale = channel_args(args)
    shrinks = torch.tensor(clip_shrinks(max_shrink), device=W.device)  # float32
    G = G.float()
    # each group's largest magnitude per row: the weights are clamped to ±shrink·absmax (the
    # authors' rule; an asymmetric grid's range loses the end that holds the outlier first)
    absmax = [W[:, cols].abs().amax(dim=1, keepdim=True).float() for cols in columns]

    def clamped(g: int, shrink: torch.Tensor) -> torch.Tensor:
        """Group ``g`` clamped by ``shrink`` (``(out, 1)``, or ``(S, 1, 1)`` for ``S``
        candidates at once)."""
        high = (absmax[g] * shrink).to(W.dtype)
        return torch.minimum(torch.maximum(W[:, columns[g]], -high), high)

    def errors(g: int) -> torch.Tensor:
        """Group ``g``'s rounding error with each shrink, ``(shrinks, out, group)``."""
        candidates = clamped(g, shrinks[:, None, None])
        rounded = rtn(candidates.reshape(-1, candidates.shape[-1]), one_scale).weight
        assert rounded is not None
        return rounded.reshape(candidates.shape).float() - W[:, columns[g]].float()

    unclipped = rtn(W, args).weight
    assert unclipped is not None
    E = unclipped.float() - W.float()
    C = E @ G
    unclipped_loss = float((E * C).sum()) / out
    chosen = torch.zeros(out, len(columns), dtype=torch.long, device=W.device)
    rows = torch.arange(out, device=W.device)
    for _ in range(CLIP_SWEEPS):
        changed = False
        for g, cols in enumerate(columns):
            block = G[cols, cols]
            current = E[:, cols]
            cross = C[:, cols] - current @ block  # the row's other groups' terms
            error = errors(g)
            value = ((error @ block) * error).sum(-1) + 2 * (error * cross).sum(-1)  # (S, out)
            best = value.argmin(dim=0)
            better = value[best, rows] < value[chosen[:, g], rows]
            if not bool(better.any()):
                continue
            changed = True
            pick = torch.where(better, best, chosen[:, g])
            new = error[pick, rows]
            C += (new - current) @ G[cols, :]
            E[:, cols] = new
            chosen[:, g] = pick
        if not changed:
            break
    factors = shrinks[chosen]
    clamped_weight = torch.cat([clamped(g, factors[:, g : g + 1]) for g in range(len(columns))], 1)
    return AwqClip(clamped_weight, factors, float((E * C).sum()) / out, unclipped_loss)
