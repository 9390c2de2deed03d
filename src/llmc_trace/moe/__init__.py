"""Mixture-of-experts calibration: fused expert weights seen as one linear layer per expert.

transformers 5 stores a layer's experts as two 3-D parameters, ``gate_up_proj`` (experts, 2 x
inner, hidden) and ``down_proj`` (experts, hidden, inner), inside an experts module whose class
carries transformers' experts-implementation attributes (``has_gate``, ``has_bias``,
``is_transposed``, ``is_concatenated``, ``_apply_gate``). No ``nn.Linear`` is left for a
compressor's hooks to see, so compressing "every Linear" leaves most of an MoE model's weights
untouched. :func:`observe_experts` makes them visible without copying a byte:

* every expert's gate, up and down projection becomes an :class:`ExpertProjection`, a module
  without parameters of its own whose weight is a *view* of the fused parameter (fetched at
  each call, so it follows the parameter wherever a residency moves or reloads it). Writing a
  compressed matrix back writes into the fused parameter itself;
* the experts module runs through :func:`observed_forward`, registered with transformers as an
  experts implementation, which calls those projections as modules (hooks see their inputs)
  and routes tokens exactly as the model does. While an expert is *observed* (see
  :attr:`ObservedExperts.observed`) it also runs on every token of the batch, so its Hessian
  is built from all tokens, not from the few the router sent it; only routed tokens reach the
  output either way.

The projections are named as published checkpoints name them (``experts.3.gate_proj``,
Mixtral's ``experts.3.w1``), read from transformers' own conversion mapping for the
architecture (:func:`per_expert_names`): those are the module paths the checkpoint stores their
integers under and the names a per-expert checkpoint's tensors are read from. Architectures
whose published checkpoints keep the fused layout (gpt-oss, Gemma 4) have no such names.
"""

from __future__ import annotations

from llmc_trace.moe.fused import fused_experts, is_fused_experts
from llmc_trace.moe.names import DOWN, GATE, UP, ExpertNames, per_expert_names
from llmc_trace.moe.observe import OBSERVED, observe_experts, observed_forward
from llmc_trace.moe.passes import expert_passes
from llmc_trace.moe.projection import (
    ExpertMLP,
    ExpertProjection,
    ObservedExperts,
    per_expert_tensors,
)
from llmc_trace.moe.routers import router_layers

__all__ = [
    "DOWN",
    "GATE",
    "OBSERVED",
    "UP",
    "ExpertMLP",
    "ExpertNames",
    "ExpertProjection",
    "ObservedExperts",
    "expert_passes",
    "fused_experts",
    "is_fused_experts",
    "observe_experts",
    "observed_forward",
    "per_expert_names",
    "per_expert_tensors",
    "router_layers",
]
