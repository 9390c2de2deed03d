"""The pipeline callbacks of SmoothQuant and AWQ: observe each pair's inputs, fold its scales.

While the sequential pipeline calibrates a subgraph, a forward pre-hook on one balance layer of
each pair inside it sees the inputs the balance layers share (padding rows left out, as for the
Hessians; a mixture's router rather than an expert, since it reads every token, and an
expert's down projection with the expert run on every token, as its Hessian would be):
SmoothQuant keeps their absolute maximum per channel, AWQ the inputs
magnitude per channel and their Gram matrix (its search's loss is a quadratic form in it,
:mod:`llmc_trace.algorithms.awq`). When the subgraph is calibrated, each pair's scales are
computed (:mod:`llmc_trace.algorithms.smoothquant`, :mod:`llmc_trace.algorithms.awq`) and
folded into its weights (:mod:`llmc_trace.algorithms.smoothing`; a pair's kept layers, a
router, take them too, chosen for the quantized ones), in graph order, before the pipeline
propagates: later subgraphs see the smoothed model, whose outputs are the same.
AWQ then clips every target of the subgraph (:func:`~llmc_trace.algorithms.awq.awq_clip`)
from the Gram matrix of its inputs as folded: a balance layer's is its pair's, divided by the
scales on both sides; any other target's (an ``o_proj`` whose pair grouped-query attention
rules out, a layer no pair balances) comes from the Hessian hooks the other methods use.
Clipping only clamps weights, so they round to the grid through the same path as RTN.

A pair is smoothed only when the pipeline brings all its modules in together (they sit in one
subgraph): a smooth layer in a subgraph that already ran, and was perhaps already written to
the checkpoint, cannot change any more. :class:`SmoothQuantCompressor` is a stage that only
smooths (a recipe quantizes after it, with GPTQ or RTN); :class:`AwqCompressor` smooths and
then rounds every target of the subgraph to the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.algorithms.awq import awq_clip, awq_search, clippable
from llmc_trace.algorithms.scheme import QuantizationArgs
from llmc_trace.algorithms.smoothing import fold_scales
from llmc_trace.algorithms.smoothquant import smoothquant_scales
from llmc_trace.core.names import ALL_TOKENS
from llmc_trace.graph.mappings import Mapping
from llmc_trace.layers.linear import as_linear
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.moe import ExpertProjection
from llmc_trace.pipelines.callbacks import NamedModules
from llmc_trace.traced.mappings import MappingSet


@dataclass
class SmoothedPair:
    """One pair as smoothed: its mapping, and for AWQ what the search measured."""

    mapping: Mapping
    scale_min: float
    scale_max: float
    loss: float | None = None
    rtn_loss: float | None = None
    ratio: float | None = None


@dataclass
class Smoother:
    """Observes the pairs of the subgraph being calibrated and folds their scales (see the
    module docstring). ``awq_args`` (the scheme's weight arguments) selects AWQ; without
    it, SmoothQuant with ``alpha``."""

    mappings: MappingSet
    alpha: float = 0.5
    awq_args: QuantizationArgs | None = None
    n_grid: int = 20
    duo_scaling: bool = True
    smoothed: list[SmoothedPair] = field(default_factory=list)
    _active: list[Mapping] = field(default_factory=list)
    #: per pair (by smooth layer): absmax, or AWQ's magnitude sum, Gram matrix and tokens
    _seen: dict[str, list[Any]] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)
    #: expert projections observed on every token while their pair is calibrated
    _experts: list[ExpertProjection] = field(default_factory=list)
    _mask: torch.Tensor | None = None

    def pairs_in(self, modules: NamedModules) -> list[Mapping]:
        """The pairs whose modules all sit in ``modules``."""
        names = {name for name, _ in modules}
        return [m for m in self.mappings.mappings if m.smooth in names and set(m.readers) <= names]

    def start(self, modules: NamedModules) -> None:
        by_name = dict(modules)
        self._active = self.pairs_in(modules)
        for mapping in self._active:
            reader = _reader([by_name[name] for name in mapping.readers])
            if isinstance(reader, ExpertProjection):
                reader.state.observed = reader.state.observed | {reader.expert}
                self._experts.append(reader)
            hook = self._observe(mapping.smooth)
            self._handles.append(reader.register_forward_pre_hook(hook))

    def see_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self._mask = batch.get("attention_mask")

    def fold(self, modules: NamedModules) -> dict[str, torch.Tensor]:
        """Compute each observed pair's scales and fold them, in graph order. For AWQ, the
        Gram matrix per token of each balance layer's inputs as folded, by layer name (the
        layers of a pair share one)."""
        by_name = dict(modules)
        grams: dict[str, torch.Tensor] = {}
        for mapping in self._active:
            seen = self._seen.pop(mapping.smooth, None)
            if seen is None:
                continue  # no token reached it (a pass of experts that skipped it)
            smooth = by_name[mapping.smooth]
            weights = [_matrix(by_name[name]) for name in mapping.balance]
            pair = self._scales(mapping, seen, weights)
            fold_scales(
                smooth,
                [by_name[name] for name in mapping.readers],
                pair[0].to(weights[0].device),
                rows=mapping.rows,
                offset=self.mappings.offset(smooth),
            )
            self.smoothed.append(pair[1])
            if self.awq_args is not None:
                s = pair[0].to(seen[1].device)
                folded = seen[1] / (s[:, None] * s[None, :]) / seen[2]
                grams.update(dict.fromkeys(mapping.balance, folded))
        return grams

    def unsmoothed(self) -> list[str]:
        """The pairs no calibrated group held whole (their layers sit in different
        subgraphs), one line each."""
        done = {pair.mapping for pair in self.smoothed}
        return [
            f"not smoothed: {m.describe()} (its layers sit in different subgraphs)"
            for m in self.mappings.mappings
            if m not in done
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for expert in self._experts:
            expert.state.observed = frozenset()
        self._experts.clear()
        self._active = []
        self._seen.clear()

    def _scales(
        self, mapping: Mapping, seen: list[Any], weights: list[torch.Tensor]
    ) -> tuple[torch.Tensor, SmoothedPair]:
        if self.awq_args is None:
            s = smoothquant_scales(seen[0], weights, self.alpha)
            return s, SmoothedPair(mapping, float(s.min()), float(s.max()))
        magnitude, G, tokens = seen
        search = awq_search(
            magnitude / tokens, G, tokens, weights, self.awq_args, n_grid=self.n_grid,
            duo_scaling=self.duo_scaling,
        )  # fmt: skip
        s = search.scales
        return s, SmoothedPair(
            mapping, float(s.min()), float(s.max()), search.loss, search.rtn_loss, search.ratio
        )

    def _observe(self, key: str):  # type: ignore[no-untyped-def]
        def observe(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0].detach()
            mask = self._mask
            if mask is not None and mask.shape != x.shape[:-1] and x.dim() == 2:
                mask = mask.reshape(-1)  # a mixture's flattened tokens
            if mask is not None and mask.shape == x.shape[:-1]:
                x = x[mask.to(device=x.device, dtype=torch.bool)]
            x = x.reshape(-1, x.shape[-1]).float()  # (tokens, in)
            seen = self._seen.get(key)
            if self.awq_args is None:
                absmax = x.abs().amax(dim=0)
                self._seen[key] = [absmax if seen is None else torch.maximum(seen[0], absmax)]
                return
            # float32 as the Hessians are: sums of products of activations
            if seen is None:
                seen = self._seen[key] = [0.0, 0.0, 0]
            seen[0] = seen[0] + x.abs().sum(dim=0)
            seen[1] = seen[1] + x.t() @ x
            seen[2] += x.shape[0]

        return observe


def _reader(modules: list[torch.nn.Module]) -> torch.nn.Module:
    """The layer whose inputs a pair's hook observes: one that reads every token (not an
    expert the router sends only some to), else the first."""
    return next((m for m in modules if not isinstance(m, ExpertProjection)), modules[0])


def _matrix(module: torch.nn.Module) -> torch.Tensor:
    layer = as_linear(module)
    assert layer is not None, "a balance layer is a linear layer"
    return layer.matrix(torch.float32)


class SmoothingCompressor(LayerCompressor):
    """A :class:`LayerCompressor` whose subgraphs are smoothed before they are compressed;
    with ``method`` ``None`` nothing is compressed (a stage that only smooths). With
    ``clip_max_shrink`` (AWQ on a grid with ranges per row), the targets are clipped after
    the folds (see the module docstring)."""

    def __init__(
        self, smoother: Smoother, *args: Any, clip_max_shrink: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.smoother = smoother
        awq_args = smoother.awq_args
        self.clip_max_shrink = clip_max_shrink if awq_args and clippable(awq_args) else None

    def wants(self, modules: NamedModules) -> bool:
        return bool(self.smoother.pairs_in(modules)) or (
            self.scheme is not None and super().wants(modules)
        )

    def on_subgraph_start(self, index: int, modules: NamedModules) -> None:
        self.smoother.start(modules)
        super().on_subgraph_start(index, modules)
        if self.clip_max_shrink is not None:  # the pairs' layers get their pair's Gram
            pairs = self.smoother.pairs_in(modules)
            balanced = {name for mapping in pairs for name in mapping.balance}
            others = [(n, layer) for n, layer in self.targets(modules) if n not in balanced]
            self._hessians.start(
                others, all_tokens=self.expert_tokens == ALL_TOKENS, subgraph=index
            )

    def on_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self.smoother.see_batch(batch)
        super().on_batch(batch)

    def on_calibrated(self, index: int, modules: NamedModules) -> None:
        grams = self.smoother.fold(modules)
        if self.clip_max_shrink is not None:
            self._clip(modules, grams)
        if self.scheme is not None:
            super().on_calibrated(index, modules)

    def on_subgraph_end(self, index: int, modules: NamedModules) -> None:
        self.smoother.stop()
        super().on_subgraph_end(index, modules)

    def _clip(self, modules: NamedModules, grams: dict[str, torch.Tensor]) -> None:
        """Clamp each target for rounding, from its pair's Gram matrix or its own Hessian
        (``2 XᵀX / n``); a target no token reached keeps its weights."""
        args = self.smoother.awq_args
        assert args is not None and self.clip_max_shrink is not None
        targets = self.targets(modules)
        hessians = self._hessians.finish(targets)
        for name, layer in targets:
            G = grams.get(name)
            hessian = hessians.get(name)
            if G is None and hessian is not None and hessian.accumulator.num_tokens:
                G = hessian.accumulator.H / 2
            if G is None:
                continue
            W = layer.matrix(self.solver.storage_dtype or layer.module.weight.dtype)
            layer.set_matrix(awq_clip(W, G, args, max_shrink=self.clip_max_shrink).weight)
