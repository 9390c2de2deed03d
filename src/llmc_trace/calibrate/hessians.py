"""Collect each target layer's Hessian from forward hooks, one per distinct input tensor.

A forward pre-hook on every targeted linear layer folds its inputs into a Hessian
(:class:`~llmc_trace.algorithms.hessian.HessianAccumulator`; padding tokens masked out, ``n``
counting tokens). Layers that read the *same input tensor* (q/k/v, gate/up) share one Hessian
instead of keeping identical copies: the first hook of a forward adds the input, the others see
the very same tensor object and only join.

Each Hessian is checked for NaN and inf after every batch it takes in (a reduction over one
``(in, in)`` matrix, 1/tokens of the product that filled it): a layer whose inputs hold NaN or
inf, or whose inputs overflow float32 in the product, stops the run there, naming the layer and
its subgraph, before a solve turns it into weights.

Fused experts (:mod:`llmc_trace.moe`) get one Hessian per expert for gate and up (they read the
same tokens) and one for down, made when the hooks go in, so an expert no token reaches still
has one (empty) on every rank. With ``all_tokens`` every observed expert runs on every token
for its Hessian while the router still decides what reaches the output; otherwise an expert
sees only the tokens routed to it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.algorithms.hessian import HessianAccumulator
from llmc_trace.core.finite import non_finite
from llmc_trace.errors import NonFiniteError
from llmc_trace.layers.linear import LinearLayer
from llmc_trace.moe import DOWN, ExpertProjection, ObservedExperts

Targets = list[tuple[str, LinearLayer]]


@dataclass
class SharedHessian:
    """One Hessian and the layers' last input it saw (a sibling seeing that very tensor only
    joins)."""

    accumulator: HessianAccumulator
    last_input: weakref.ref[torch.Tensor] | None = None
    #: for an expert's Hessian: (its experts module, the expert, whether it feeds down)
    expert_key: tuple[int, int, bool] | None = None


@dataclass
class HessianCollector:
    """The hooks of the targets being calibrated and the Hessians they fill (see the module
    docstring): :meth:`start` puts the hooks in, :meth:`see_batch` gives them the batch's
    attention mask, :meth:`finish` takes them out and hands the Hessians over."""

    _hessians: dict[str, SharedHessian] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)
    _mask: torch.Tensor | None = None
    _subgraph: int = 0

    def start(self, targets: Targets, *, all_tokens: bool, subgraph: int) -> None:
        """Hook every layer of ``targets`` (of the pipeline's ``subgraph``, which a failure
        names); with ``all_tokens``, their experts run on every token."""
        self._subgraph = subgraph
        shared: list[SharedHessian] = []
        for name, layer in targets:
            state = None
            if isinstance(layer.module, ExpertProjection):
                state = layer.module.state
                if all_tokens:
                    state.observed = state.observed | {layer.module.expert}
                # made now, not at the first call: an expert no token reaches still has one
                # (empty), on every rank, so the ranks merge the same Hessians
                self._hessians[name] = self._expert_entry(layer, shared)
            hook = self._hook(name, layer.in_features, shared, state)
            self._handles.append(layer.module.register_forward_pre_hook(hook))

    def see_batch(self, batch: dict[str, torch.Tensor]) -> None:
        """The batch about to run: its attention mask says which rows are real tokens."""
        self._mask = batch.get("attention_mask")

    def finish(self, targets: Targets) -> dict[str, SharedHessian | None]:
        """Remove every hook, stop observing the experts, and hand over each target's Hessian
        (``None`` for a layer that never ran), in the order of ``targets``."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for _, layer in targets:
            if isinstance(layer.module, ExpertProjection):
                layer.module.state.observed = frozenset()
        return {name: self._hessians.pop(name, None) for name, _ in targets}

    def discard(self, names: Iterable[str]) -> None:
        """Drop the Hessians of ``names`` that :meth:`finish` did not hand over."""
        for name in names:
            self._hessians.pop(name, None)

    def _expert_entry(self, layer: LinearLayer, shared: list[SharedHessian]) -> SharedHessian:
        """The Hessian of an expert projection: gate and up of one expert read the same
        input and share one; down has its own."""
        projection = layer.module
        assert isinstance(projection, ExpertProjection)
        key = (id(projection.state), projection.expert, projection.part == DOWN)
        entry = next((s for s in shared if s.expert_key == key), None)
        if entry is None:
            device = layer.module.weight.device
            entry = SharedHessian(HessianAccumulator(layer.in_features, device), expert_key=key)
            shared.append(entry)
        return entry

    def _hook(  # type: ignore[no-untyped-def]
        self,
        name: str,
        in_features: int,
        shared: list[SharedHessian],
        experts: ObservedExperts | None,
    ):
        def observe(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            entry = self._hessians.get(name)
            if entry is None:
                entry = next(
                    (s for s in shared if s.last_input is not None and s.last_input() is x), None
                )
                if entry is None:
                    entry = SharedHessian(HessianAccumulator(in_features, x.device))
                    shared.append(entry)
                self._hessians[name] = entry
            if entry.last_input is not None and entry.last_input() is x:
                return  # a sibling already added this very input
            mask = self._token_mask(x, experts)
            entry.accumulator.add(x.detach(), mask)
            entry.last_input = weakref.ref(x)
            if entry.accumulator.problem() is not None:
                raise self._not_finite(name, x.detach(), mask)

        return observe

    def _not_finite(self, name: str, x: torch.Tensor, mask: torch.Tensor | None) -> NonFiniteError:
        """The error for layer ``name``, whose Hessian stopped being finite on input ``x``:
        its real tokens (``mask``) hold NaN or inf, or their products overflowed."""
        tokens = x if mask is None else x[mask.to(device=x.device, dtype=torch.bool)]
        problem = non_finite(tokens)
        where = f"{name} (subgraph {self._subgraph})"
        what = (
            f"the calibration inputs of {where} hold {problem}"
            if problem is not None
            else f"the Hessian of {where} overflowed float32: its inputs reach "
            f"{tokens.abs().max().item():.3g}"
        )
        remedy = (
            "check the calibration data, or calibrate without error propagation "
            "(--no-propagate) if compressed layers before it caused it"
            if x.dtype == torch.float32
            else "calibrate in float32 (--dtype float32)"
        )
        return NonFiniteError(
            f"{what}.",
            hint="The model's weights are finite, so its forward pass diverged on this data "
            f"before this layer: {remedy}. Nothing was written.",
            location=name,
        )

    def _token_mask(self, x: torch.Tensor, experts: ObservedExperts | None) -> torch.Tensor | None:
        """Which rows of ``x`` are real tokens: the batch's attention mask where it lines up
        with ``x``; for an expert, the mask's entries for the tokens it was called on (its
        input is the flattened batch, or the rows :class:`ObservedExperts` names)."""
        mask = self._mask
        if mask is None:
            return None
        if experts is None:
            return mask if mask.shape == x.shape[:-1] else None
        flat = mask.reshape(-1)
        rows = experts.rows
        if rows is None:
            return flat if flat.shape[0] == x.shape[0] else None
        return flat.to(rows.device)[rows] if rows.shape[0] == x.shape[0] else None
