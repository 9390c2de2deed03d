"""SmoothQuant's scales: move activation outliers into the weights before both are quantized.

Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models" (https://arxiv.org/abs/2211.10438), section 4: a channel ``j`` whose
activations reach ``max|X_j|`` while the weights reading it reach ``max|W_j|`` is divided by

    s_j = max|X_j|^α / max|W_j|^(1-α)

in the activations (folded into the layer that produces them) and multiplied by it in the
weights, which evens out the two ranges; α (0.5 in the paper, higher for models with larger
outliers) says how much of the difficulty moves to the weights.
"""

from __future__ import annotations

import torch

#: floor of a scale and of the ranges it is computed from: a channel no token used stays as it is
MIN_SCALE = 1e-5


def smoothquant_scales(
    activation_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float
) -> torch.Tensor:
    """Per-channel scales ``s`` (shape ``(in,)``) from the activations' absolute maximum per
    channel and the balance layers' ``(out, in)`` weights."""
    W_absmax = torch.stack([W.abs().amax(dim=0) for W in weights]).amax(dim=0).float()
    X_absmax = activation_absmax.float().clamp(min=MIN_SCALE)
    s = X_absmax.pow(alpha) / W_absmax.clamp(min=MIN_SCALE).pow(1 - alpha)
    return s.clamp(min=MIN_SCALE)
