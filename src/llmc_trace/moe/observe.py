"""Run fused experts through one module per expert and projection, so hooks see each expert.

:func:`observe_experts` installs :class:`~llmc_trace.moe.projection.ExpertProjection` modules
on every fused experts module and routes its forward through :func:`observed_forward`,
registered with transformers as an experts implementation: it calls those projections as
modules (hooks see their inputs) and routes tokens exactly as the model does. While an expert
is *observed* (:attr:`~llmc_trace.moe.projection.ObservedExperts.observed`) it also runs on
every token of the batch, so its Hessian is built from all tokens, not from the few the router
sent it; only routed tokens reach the output either way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from llmc_trace.moe.fused import fused_experts
from llmc_trace.moe.names import DOWN, GATE, UP, ExpertNames, per_expert_names
from llmc_trace.moe.projection import ExpertMLP, ExpertProjection, ObservedExperts

#: The experts implementation :func:`observe_experts` selects while calibrating.
OBSERVED = "llmc_trace_observed"


def observed_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """The experts' forward through their :class:`ExpertProjection` modules.

    The same routing and arithmetic as transformers' eager experts: each token's output is the
    sum over its top-k experts of routing weight x down(gate_fn(gate(x), up(x))). An observed
    expert additionally runs on every token, and its routed tokens' outputs are taken from that
    run, so observing changes no value.
    """
    state: ObservedExperts = self._llmc_observed
    out = torch.zeros_like(hidden_states)
    with torch.no_grad():
        routed = torch.nn.functional.one_hot(top_k_index, num_classes=state.num_experts + 1)
        routed = routed[..., : state.num_experts].permute(2, 0, 1)  # (experts, tokens, top_k)
    for expert, projections in enumerate(state.projections):
        token_idx, position = torch.nonzero(routed[expert], as_tuple=True)
        everyone = expert in state.observed
        if not everyone and token_idx.numel() == 0:
            continue
        if everyone:
            state.rows, x = None, hidden_states
        else:
            state.rows, x = token_idx, hidden_states[token_idx]
        y = _expert_output(self, projections, x)
        if everyone:
            y = y[token_idx]
        weight = top_k_weights[token_idx, position, None]
        out.index_add_(0, token_idx, (y * weight).to(out.dtype))
    state.rows = None
    return out


def _expert_output(
    experts: torch.nn.Module, projections: dict[str, ExpertProjection], x: torch.Tensor
) -> torch.Tensor:
    """One expert on ``x``: gate and up read the very same tensor (so they share a Hessian)."""
    if experts.has_gate:
        gate, up = projections[GATE](x), projections[UP](x)
        concatenated = getattr(experts, "is_concatenated", True)
        if concatenated:
            joined = torch.cat([gate, up], dim=-1)
        else:  # interleaved: gate, up, gate, up, ... as the fused weight stores them
            joined = torch.stack([gate, up], dim=-1).flatten(-2)
        inner = experts._apply_gate(joined)
    else:
        inner = experts.act_fn(projections[UP](x))
    y = projections[DOWN](inner)
    if getattr(experts, "has_post_expert_norm", False):
        y = experts.post_expert_norm(y)
    return y


def _register_implementation() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if OBSERVED not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(OBSERVED, observed_forward)


@contextlib.contextmanager
def observe_experts(model: torch.nn.Module) -> Iterator[list[ObservedExperts]]:
    """Install :class:`ExpertProjection` modules on every fused experts module of ``model``
    and route its forward through :func:`observed_forward` (see the module docstring); on exit
    the model is as it was, with whatever the projections wrote into its fused weights.
    Experts already observed (an enclosing call) are left to that call."""
    _register_implementation()
    installed: list[ObservedExperts] = []
    saved: list[tuple[torch.nn.Module, object]] = []
    #: per path without layer numbers: reading transformers' mapping walks the whole model
    known: dict[str, ExpertNames | None] = {}
    try:
        for path, module in fused_experts(model):
            if hasattr(module, "_llmc_observed"):
                continue
            key = re.sub(r"\.\d+(?=\.|$)", ".#", path)
            if key not in known:
                known[key] = per_expert_names(model, path)
            names = known[key]
            leaves = names or ExpertNames("gate_proj", "up_proj", "down_proj")
            projections = []
            for expert in range(int(module.down_proj.shape[0])):
                parts = {
                    part: ExpertProjection(module, expert, part, stored=names is not None)
                    for part in ((GATE, UP, DOWN) if module.has_gate else (UP, DOWN))
                }
                module.add_module(
                    str(expert), ExpertMLP({leaves.leaf(p): proj for p, proj in parts.items()})
                )
                projections.append(parts)
            state = ObservedExperts(module, projections)
            module._llmc_observed = state
            config = module.config
            saved.append((config, config._experts_implementation))
            config._experts_implementation = OBSERVED
            installed.append(state)
        yield installed
    finally:
        for config, implementation in reversed(saved):
            config._experts_implementation = implementation
        for state in installed:
            for expert in range(state.num_experts):
                delattr(state.module, str(expert))
            del state.module._llmc_observed
