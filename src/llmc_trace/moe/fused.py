"""Find transformers' experts modules whose expert weights are fused 3-D parameters.

transformers 5 stores a layer's experts as ``gate_up_proj`` (experts, 2 x inner, hidden) and
``down_proj`` (experts, hidden, inner) inside a module whose class carries its
experts-implementation attributes (``has_gate``, ``has_bias``, ``is_transposed``); that is what
:func:`is_fused_experts` recognises, on any device, ``meta`` included.
"""

from __future__ import annotations

import torch


def is_fused_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a transformers experts module with fused 3-D expert weights."""
    down = getattr(module, "down_proj", None)
    return (
        isinstance(down, torch.Tensor)
        and down.dim() == 3
        and all(hasattr(module, a) for a in ("has_gate", "has_bias", "is_transposed"))
    )


def fused_experts(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every fused experts module of ``model`` with its path, in module order."""
    return [(name, m) for name, m in model.named_modules() if is_fused_experts(m)]
