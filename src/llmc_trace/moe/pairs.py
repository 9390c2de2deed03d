"""The smooth -> balance layers inside a fused experts module, for AWQ and SmoothQuant.

A trace into a mixture-of-experts layer records its experts module as one call: the experts it
runs depend on the router's choice, a loop no trace can record. What happens inside is
transformers' experts contract (:mod:`llmc_trace.moe.observe` runs it projection by
projection): every expert's gate and up projection reads the call's hidden states, and its down
projection reads ``act(gate(x)) * up(x)``, so a scale on the experts' input channels is
balanced by every expert's gate and up columns, and a scale on one expert's up rows by its
down columns. Those are candidates, as a graph's pairs are; the twin proves each (an
architecture whose gate function adds to ``up`` or clamps it, as gpt-oss's does, fails there
and is skipped).
"""

from __future__ import annotations

import torch

from llmc_trace.moe.fused import is_fused_experts
from llmc_trace.moe.names import DOWN, GATE, UP
from llmc_trace.moe.projection import ExpertProjection


def expert_inputs(path: str, module: torch.nn.Module) -> tuple[str, ...] | None:
    """The projections reading the hidden states the experts module at ``path`` is called
    with (each expert's gate and up), while :func:`~llmc_trace.moe.observe.observe_experts`
    is active; ``None`` for any other module."""
    if not is_fused_experts(module):
        return None
    return tuple(name for name, part in _projections(path, module) if part in (GATE, UP))


def expert_pairs(path: str, module: torch.nn.Module) -> list[tuple[str, str]]:
    """Each expert's ``(up, down)`` of the experts module at ``path``: what its down
    projection reads is its up projection's output times the gate's activation (only for
    experts with a gate; ``act(up(x))`` passes no scale)."""
    if not is_fused_experts(module) or not module.has_gate:
        return []
    parts = dict(
        ((name.rpartition(".")[0], part), name) for name, part in _projections(path, module)
    )
    experts = dict.fromkeys(expert for expert, _ in parts)
    return [(parts[(e, UP)], parts[(e, DOWN)]) for e in experts]


def _projections(path: str, module: torch.nn.Module) -> list[tuple[str, str]]:
    """Every projection :func:`~llmc_trace.moe.observe.observe_experts` installed on
    ``module``, with its module path and part, in expert order."""
    return [
        (f"{path}.{name}", child.part)
        for name, child in module.named_modules()
        if isinstance(child, ExpertProjection)
    ]
