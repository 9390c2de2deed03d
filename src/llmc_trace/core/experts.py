"""Fused mixture-of-experts weights seen as one linear layer per expert and projection.

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

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: The experts implementation :func:`observe_experts` selects while calibrating.
OBSERVED = "llmc_trace_observed"

GATE, UP, DOWN = "gate", "up", "down"


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


class ExpertProjection(torch.nn.Module):
    """One expert's gate, up or down projection, as a linear layer over a view of its experts
    module's fused parameter (see the module docstring). ``weight`` is that view, ``(out, in)``;
    it has no parameters, so the model's state dict and checkpoint names do not change."""

    def __init__(self, experts: torch.nn.Module, expert: int, part: str, stored: bool) -> None:
        super().__init__()
        object.__setattr__(self, "_experts", experts)  # the parent: not a submodule
        self.expert = expert
        self.part = part
        #: whether the checkpoint stores this projection as its own tensors (else fused, dense)
        self.stored_per_expert = stored

    @property
    def state(self) -> ObservedExperts:
        """What :func:`observe_experts` installed on this projection's experts module."""
        return self._experts._llmc_observed

    @property
    def fused_name(self) -> str:
        """The experts module's parameter this projection is a view of."""
        if self.part == DOWN:
            return "down_proj"
        return "gate_up_proj" if self._experts.has_gate else "up_proj"

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_of(getattr(self._experts, self.fused_name))

    def weight_of(self, fused: torch.Tensor) -> torch.Tensor:
        """This projection's ``(out, in)`` view of ``fused`` (its parameter, or a copy of it)."""
        experts, part = self._experts, self.part
        w = fused[self.expert]
        if experts.is_transposed:
            w = w.t()
        if part != DOWN and experts.has_gate:
            return _half(w, part, getattr(experts, "is_concatenated", True))
        return w

    @property
    def bias(self) -> torch.Tensor | None:
        experts, part = self._experts, self.part
        if not experts.has_bias:
            return None
        if part == DOWN:
            return experts.down_proj_bias[self.expert]
        name = "gate_up_proj_bias" if experts.has_gate else "up_proj_bias"
        b = getattr(experts, name)[self.expert]
        if experts.has_gate:
            return _half(b, part, getattr(experts, "is_concatenated", True))
        return b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out, in_ = self.weight.shape
        return f"expert={self.expert}, part={self.part}, in={in_}, out={out}"


def _half(t: torch.Tensor, part: str, concatenated: bool) -> torch.Tensor:
    """The gate or up rows of a fused gate-up tensor: halves when concatenated, else the even
    (gate) and odd (up) rows of an interleaved one."""
    if concatenated:
        half = t.shape[0] // 2
        return t[:half] if part == GATE else t[half:]
    return t[0::2] if part == GATE else t[1::2]


class ExpertMLP(torch.nn.Module):
    """One expert's projections under the names its checkpoint uses (``3.gate_proj``)."""

    def __init__(self, projections: dict[str, ExpertProjection]) -> None:
        super().__init__()
        for leaf, projection in projections.items():
            self.add_module(leaf, projection)


@dataclass
class ObservedExperts:
    """What :func:`observe_experts` installed on one experts module.

    ``observed`` holds the experts that run on every token (their hooks then see all of the
    batch); ``rows`` the token indices of the call in progress (``None``: all tokens), which
    a hook uses to mask padding out of an expert's inputs.
    """

    module: torch.nn.Module
    projections: list[dict[str, ExpertProjection]]
    observed: frozenset[int] = frozenset()
    rows: torch.Tensor | None = None

    @property
    def num_experts(self) -> int:
        return len(self.projections)


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
    the model is as it was, with whatever the projections wrote into its fused weights."""
    _register_implementation()
    installed: list[ObservedExperts] = []
    saved: list[tuple[torch.nn.Module, object]] = []
    try:
        for path, module in fused_experts(model):
            names = per_expert_names(model, path)
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


def per_expert_tensors(model: torch.nn.Module) -> dict[str, list[tuple[str, ExpertProjection]]]:
    """For each fused experts parameter of ``model`` (by its state-dict name) while
    :func:`observe_experts` is active, the projections viewing it, with their module paths:
    what a checkpoint stores in its place when the architecture's checkpoints store experts one
    by one (``ExpertProjection.stored_per_expert``), in expert order."""
    found: dict[str, list[tuple[str, ExpertProjection]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, ExpertProjection):
            path = name.rsplit(".", 2)[0]
            found.setdefault(f"{path}.{module.fused_name}", []).append((name, module))
    return found


def router_layers(model: torch.nn.Module) -> list[str]:
    """The linear layers that route tokens to experts (or gate a shared expert), kept in full
    precision by default as published MoE checkpoints keep them: a small weight whose rounding
    would change which experts every token reaches. Found generally: in the module holding an
    experts container (fused experts, or a list of expert modules), a linear layer outside the
    experts with one output per expert, or a single output."""
    from llmc_trace.core.linear import as_linear

    found: list[str] = []
    for path, module in model.named_modules():
        count = _experts_count(path, module)
        if count is None:
            continue
        parent_path = path.rpartition(".")[0]
        parent = model.get_submodule(parent_path)
        for name, child in parent.named_modules():
            full = f"{parent_path}.{name}".strip(".")
            layer = as_linear(child) if not isinstance(child, ExpertProjection) else None
            if layer is None or full.startswith(f"{path}."):
                continue
            if layer.out_features in (count, 1) and full not in found:
                found.append(full)
    return found


def _experts_count(path: str, module: torch.nn.Module) -> int | None:
    """How many experts ``module`` holds, if it is an experts container: fused experts, or a
    list of expert modules stored under the name ``experts`` (Switch Transformers, Mixtral in
    older code)."""
    if is_fused_experts(module):
        return int(module.down_proj.shape[0])
    listed = isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
    if listed and path.rpartition(".")[2] == "experts" and len(module) > 1:
        return len(module)
    return None
