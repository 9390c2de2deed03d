"""How published checkpoints name one expert's projections, read from transformers' mapping.

The names (``experts.3.gate_proj``, Mixtral's ``experts.3.w1``) are the module paths a
checkpoint stores a projection's integers under and the names a per-expert checkpoint's tensors
are read from. Architectures whose published checkpoints keep the fused layout (gpt-oss,
Gemma 4) have no such names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

GATE, UP, DOWN = "gate", "up", "down"


@dataclass(frozen=True)
class ExpertNames:
    """The leaf names published checkpoints give one expert's projections (``gate_proj`` or
    Mixtral's ``w1``), as transformers' conversion mapping reads them back."""

    gate: str
    up: str
    down: str

    def leaf(self, part: str) -> str:
        return {GATE: self.gate, UP: self.up, DOWN: self.down}[part]


def per_expert_names(model: torch.nn.Module, path: str) -> ExpertNames | None:
    """How published checkpoints of ``model``'s architecture name the experts at ``path``, one
    tensor per expert and projection; ``None`` when they store them fused.

    Read from the converters transformers applies when it loads such a checkpoint (the one
    merging ``experts.*.gate_proj.weight`` and ``experts.*.up_proj.weight`` into
    ``experts.gate_up_proj``), so loading our checkpoint takes the same path as loading the
    original. Experts with biases or transposed weights are never stored per expert (no
    architecture does).
    """
    module = model.get_submodule(path)
    if (
        module.has_bias
        or module.is_transposed
        or not module.has_gate
        or not getattr(module, "is_concatenated", True)
    ):
        return None
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    leaves: dict[str, list[str]] = {}
    for transform in get_model_conversion_mapping(model, add_legacy=False):
        if not isinstance(transform, WeightConverter):
            continue
        scope = getattr(transform, "scope_prefix", None) or ""
        if scope and f".{scope}." not in f".{path}.":  # a submodel's mapping, elsewhere
            continue
        for target in transform.target_patterns:
            param = target.rpartition(".")[2]
            if param not in ("gate_up_proj", "down_proj"):
                continue
            if not re.search(re.escape(target.rpartition(".")[0].lstrip(".")) + "$", path):
                continue
            sources = [_expert_leaf(s) for s in transform.source_patterns]
            if all(sources):
                leaves[param] = sources  # type: ignore[assignment]
    gate_up, down = leaves.get("gate_up_proj"), leaves.get("down_proj")
    if gate_up is None or down is None or len(gate_up) != 2 or len(down) != 1:
        return None
    return ExpertNames(gate_up[0], gate_up[1], down[0])


def _expert_leaf(pattern: str) -> str | None:
    """``gate_proj`` from ``mlp.experts.*.gate_proj.weight``; ``None`` for other patterns."""
    match = re.search(r"experts\.\*\.(\w+)\.weight$", pattern)
    return match.group(1) if match else None
