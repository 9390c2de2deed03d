"""One expert's gate, up or down projection as a linear layer over a view of its fused weight.

An :class:`ExpertProjection` has no parameters of its own: its weight is a view of the experts
module's fused parameter, fetched at each call so it follows the parameter wherever a residency
moves or reloads it, and a compressed matrix written back lands in the fused parameter itself
(:class:`~llmc_trace.layers.linear.LinearView`). The model's state dict does not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.layers.linear import LinearView
from llmc_trace.moe.names import DOWN, GATE


class ExpertProjection(LinearView):
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
        """What :func:`~llmc_trace.moe.observe.observe_experts` installed on this projection's
        experts module."""
        return self._experts._llmc_observed

    @property
    def fused_name(self) -> str:
        """The experts module's parameter this projection is a view of."""
        if self.part == DOWN:
            return "down_proj"
        return "gate_up_proj" if self._experts.has_gate else "up_proj"

    @property
    def fused(self) -> torch.nn.Parameter:
        """The experts module's parameter this projection is a view of."""
        return getattr(self._experts, self.fused_name)

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_of(self.fused)

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
    """What :func:`~llmc_trace.moe.observe.observe_experts` installed on one experts module.

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


def per_expert_tensors(model: torch.nn.Module) -> dict[str, list[tuple[str, ExpertProjection]]]:
    """For each fused experts parameter of ``model`` (by its state-dict name) while
    :func:`~llmc_trace.moe.observe.observe_experts` is active, the projections viewing it, with
    their module paths: what a checkpoint stores in its place when the architecture's
    checkpoints store experts one by one (``ExpertProjection.stored_per_expert``), in expert
    order."""
    found: dict[str, list[tuple[str, ExpertProjection]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, ExpertProjection):
            path = name.rsplit(".", 2)[0]
            found.setdefault(f"{path}.{module.fused_name}", []).append((name, module))
    return found
