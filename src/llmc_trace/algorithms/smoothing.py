"""Fold a per-channel scale into a smooth -> balance pair, leaving the model's function as it was.

AWQ and SmoothQuant both rewrite ``W_b x`` as ``(W_b diag(s)) (diag(s)⁻¹ x)``: the smooth
layer's output channels are divided by ``s`` and the balance layers' input columns multiplied
by it, in the weights themselves, so the checkpoint is an ordinary one with nothing to undo at
load time. A linear smooth layer divides its rows (and bias); a norm divides the factor it
multiplies each channel by, which is ``weight`` for most norms and ``1 + weight`` for Gemma's
(the ``offset``, measured by :func:`norm_offset`), and its bias. A balance layer is a linear
layer (one expert's projection writes into its fused parameter) or a router, whose ``(out, in)``
weight is multiplied the same way.
"""

from __future__ import annotations

import copy

import torch

from llmc_trace.layers.linear import as_linear


@torch.no_grad()
def fold_scales(
    smooth: torch.nn.Module,
    balance: list[torch.nn.Module],
    scales: torch.Tensor,
    *,
    rows: tuple[int, int] | None = None,
    offset: float = 0.0,
) -> None:
    """Divide ``smooth``'s output channels (``rows`` of them, default all) by ``scales`` and
    multiply each balance layer's input columns by them, in place. ``offset`` is the smooth
    norm's (see the module docstring)."""
    s = scales.float()
    layer = as_linear(smooth)
    if layer is not None:
        W = layer.matrix(torch.float32)  # (out, in)
        lo, hi = rows or (0, layer.out_features)
        W = W.clone()
        W[lo:hi] /= s[:, None]
        layer.set_matrix(W)
        bias = getattr(smooth, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias[lo:hi] = (bias[lo:hi].float() / s).to(bias.dtype)
    else:
        weight = smooth.weight
        weight.copy_(((weight.float() + offset) / s - offset).to(weight.dtype))
        bias = getattr(smooth, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.copy_((bias.float() / s).to(bias.dtype))
    for module in balance:
        target = as_linear(module)
        if target is not None:
            target.set_matrix(target.matrix(torch.float32) * s[None, :])
        else:  # a router: logits = x Wᵀ with its own (out, in) weight
            weight = module.weight
            weight.copy_((weight.float() * s[None, :]).to(weight.dtype))


@torch.no_grad()
def norm_offset(norm: torch.nn.Module) -> float:
    """What a norm adds to its ``weight`` before multiplying: 0 for ``x̂ · w``, 1 for Gemma's
    ``x̂ · (1 + w)``, measured on a copy by running it with ``w = 0`` and ``w = 1``."""
    probe = copy.deepcopy(norm).float()
    width = probe.weight.shape[0]
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    bias = getattr(probe, "bias", None)
    if isinstance(bias, torch.Tensor):
        bias.zero_()
    probe.weight.fill_(0.0)
    at_zero = probe(x)
    probe.weight.fill_(1.0)
    at_one = probe(x)
    step = (at_one - at_zero).abs()
    if float(step.max()) == 0.0:
        return 0.0
    ratio = (at_zero / (at_one - at_zero))[step > 1e-3 * step.max()]
    return round(float(ratio.median()), 6)
