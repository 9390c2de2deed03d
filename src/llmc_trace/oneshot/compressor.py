"""``LayerCompressor``: the callbacks that turn what a pipeline shows into compressed weights.

During calibration a forward hook on every targeted linear layer (``Linear``, or GPT-2's
transposed ``Conv1D``: see :mod:`llmc_trace.layers.linear`) folds its inputs into a Hessian
(:class:`~llmc_trace.algorithms.hessian.HessianAccumulator`; padding tokens masked out, ``n``
counting tokens). Layers that read the *same input tensor* (q/k/v, gate/up) share one Hessian
instead of keeping identical copies: the first hook of a forward adds the input, the others see
the very same tensor object and only join. When the pipeline reports the subgraph calibrated,
each layer is compressed (GPTQ, SparseGPT, round-to-nearest or magnitude pruning) on its
``(out, in)`` weight matrix and its weight replaced by the result in the module's own layout,
so error propagation sees compressed outputs.

Mixture-of-experts layers stored fused (3-D parameters, :mod:`llmc_trace.moe`) are
compressed expert by expert: each expert's gate, up and down projection is a target of its own
with its own Hessian. By default (``expert_tokens="all"``) every expert runs on every token for
its Hessian while the router still decides what reaches the output, so no expert is calibrated
on a handful of tokens; with ``"routed"`` an expert sees only the tokens routed to it, and one
whose Hessian holds fewer than ``min_expert_tokens`` tokens is rounded to nearest instead,
recorded in its :class:`LayerResult` (never silently). ``expert_group`` bounds how many
experts' Hessians are alive at once: the pipeline then calibrates a layer's experts in
several passes (:meth:`LayerCompressor.passes`).
"""

from __future__ import annotations

import logging
import time
import weakref
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.algorithms.baseline import baseline_weight, damped_error
from llmc_trace.algorithms.gptq import gptq
from llmc_trace.moe import DOWN, ExpertProjection, ObservedExperts
from llmc_trace.layers.linear import LinearLayer, as_linear, is_linear
from llmc_trace.core.names import (
    ALL_TOKENS,
    BASELINE,
    DATA_METHODS,
    GPTQ,
    MAGNITUDE,
    METHODS,
    RTN,
    SPARSEGPT,
)
from llmc_trace.algorithms.hessian import HessianAccumulator
from llmc_trace.algorithms.quantize import QuantizedWeight, rtn
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.algorithms.sparsegpt import Sparsity, sparsegpt
from llmc_trace.core.device_peak import DevicePeaks, PeakReading
from llmc_trace.core.world import World
from llmc_trace.pipelines.callbacks import NamedModules

logger = logging.getLogger(__name__)


@dataclass
class _SharedHessian:
    accumulator: HessianAccumulator
    last_input: weakref.ref[torch.Tensor] | None = None
    #: for an expert's Hessian: (its experts module, the expert, whether it feeds down)
    expert_key: tuple[int, int, bool] | None = None


@dataclass
class LayerResult:
    """One compressed layer: the method's loss (GPTQ/SparseGPT objective), seconds taken, and
    what a compression report shows beside them."""

    name: str
    loss: float
    seconds: float
    shares_hessian_with: str | None = None
    #: what was done instead of the stage's method, and why (an expert too few tokens reached)
    fallback: str | None = None
    #: the loss of the method's data-free baseline (round-to-nearest, magnitude pruning) on
    #: the same weights and damped Hessian (:mod:`llmc_trace.algorithms.baseline`); None
    #: without a Hessian
    baseline_loss: float | None = None
    #: tokens in the layer's Hessian; None without one
    num_tokens: int | None = None
    #: CUDA's peak allocated bytes during the solve, when ``device_peaks`` measures it
    device_peak_bytes: int | None = None


@dataclass
class LayerCompressor:
    """Pipeline callbacks compressing every targeted layer of a subgraph (see module docstring).

    ``scheme`` is ``None`` for pruning without quantization; ``sparsity`` is ``None`` for
    quantization without pruning. ``storage_dtype`` is the checkpoint's dtype: weights are
    compressed from (and scales computed in) that dtype whatever dtype the forward passes ran
    in, so the stored integers dequantize to exactly the weight left in the module.
    ``keep_zeros`` names layers an earlier stage pruned: GPTQ keeps their zeros (its sweep
    would otherwise fill them back in); round-to-nearest keeps them by itself (0 rounds to the
    zero point, which dequantizes to 0). ``device_peaks``, when given, measures each solve's
    CUDA peak (it resets CUDA's process-wide peak counter per solve, keeping the run's peak;
    off by default, so a caller measuring its own peak keeps it).
    """

    method: str
    scheme: QuantizationScheme | None
    sparsity: Sparsity | None = None
    blocksize: int = 128
    percdamp: float = 0.01
    refine_passes: int = 0
    storage_dtype: torch.dtype | None = None
    keep_zeros: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()
    expert_tokens: str = ALL_TOKENS
    min_expert_tokens: int = 8
    expert_group: int | None = None
    world: World = field(default_factory=World)
    device_peaks: DevicePeaks | None = None
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)
    results: list[LayerResult] = field(default_factory=list)
    _hessians: dict[str, _SharedHessian] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)
    _mask: torch.Tensor | None = None

    def is_target(self, name: str, module: torch.nn.Module) -> bool:
        if not is_linear(module) or name in self.skip:
            return False
        if self.scheme is not None:
            return self.scheme.is_target(name, module)
        return not name.endswith("lm_head")

    def targets(self, modules: NamedModules) -> list[tuple[str, LinearLayer]]:
        return [
            (name, layer)
            for name, module in modules
            if (layer := as_linear(module)) is not None and self.is_target(name, module)
        ]

    def wants(self, modules: NamedModules) -> bool:
        return bool(self.targets(modules))

    def passes(self, modules: NamedModules) -> list[NamedModules]:
        """The calibration passes ``modules`` need: one, unless ``expert_group`` bounds the
        experts calibrated at once; then the first pass takes every other target and the first
        group of experts, and each later pass the next group (the layer runs once per pass)."""
        if self.expert_group is None or self.method not in DATA_METHODS:
            return [modules]
        targets = [(n, layer.module) for n, layer in self.targets(modules)]
        groups: dict[tuple[int, int], list[tuple[str, torch.nn.Module]]] = {}
        others = []
        for name, module in targets:
            if isinstance(module, ExpertProjection):
                groups.setdefault((id(module.state), module.expert), []).append((name, module))
            else:
                others.append((name, module))
        experts = list(groups.values())
        if len(experts) <= self.expert_group:
            return [modules]
        size = self.expert_group
        chunks = [experts[i : i + size] for i in range(0, len(experts), size)]
        parts = [[entry for expert in chunk for entry in expert] for chunk in chunks]
        parts[0] = others + parts[0]
        return parts

    def on_subgraph_start(self, index: int, modules: NamedModules) -> None:
        if self.method not in DATA_METHODS:
            return
        shared: list[_SharedHessian] = []
        for name, layer in self.targets(modules):
            state = None
            if isinstance(layer.module, ExpertProjection):
                state = layer.module.state
                if self.expert_tokens == ALL_TOKENS:
                    state.observed = state.observed | {layer.module.expert}
                # made now, not at the first call: an expert no token reaches still has one
                # (empty), on every rank, so the ranks merge the same Hessians
                self._hessians[name] = self._expert_entry(layer, shared)
            hook = self._hook(name, layer.in_features, shared, state)
            self._handles.append(layer.module.register_forward_pre_hook(hook))

    def _expert_entry(self, layer: LinearLayer, shared: list[_SharedHessian]) -> _SharedHessian:
        """The Hessian of an expert projection: gate and up of one expert read the same
        input and share one; down has its own."""
        projection = layer.module
        assert isinstance(projection, ExpertProjection)
        key = (id(projection.state), projection.expert, projection.part == DOWN)
        entry = next((s for s in shared if s.expert_key == key), None)
        if entry is None:
            device = layer.module.weight.device
            entry = _SharedHessian(HessianAccumulator(layer.in_features, device), expert_key=key)
            shared.append(entry)
        return entry

    def _hook(  # type: ignore[no-untyped-def]
        self,
        name: str,
        in_features: int,
        shared: list[_SharedHessian],
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
                    entry = _SharedHessian(HessianAccumulator(in_features, x.device))
                    shared.append(entry)
                self._hessians[name] = entry
            if entry.last_input is not None and entry.last_input() is x:
                return  # a sibling already added this very input
            entry.accumulator.add(x.detach(), self._token_mask(x, experts))
            entry.last_input = weakref.ref(x)

        return observe

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

    def on_batch(self, batch: dict[str, torch.Tensor]) -> None:
        self._mask = batch.get("attention_mask")

    def on_calibrated(self, index: int, modules: NamedModules) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        targets = self.targets(modules)
        for _, layer in targets:
            if isinstance(layer.module, ExpertProjection):
                layer.module.state.observed = frozenset()
        entries = {name: self._hessians.pop(name, None) for name, _ in targets}
        world = self.world
        if world.distributed:
            # every rank's Hessians become the mean over all ranks' tokens, merged in the same
            # order everywhere (the targets'), before any solve
            for entry in {id(e): e for e in entries.values() if e is not None}.values():
                acc = entry.accumulator
                acc.num_tokens = world.sum_mean(acc.H, acc.num_tokens)
        # the solves are shared out by cost; one rank alone does them all
        owner = world.owners([_solve_cost(m) for _, m in targets])
        mine = {name for (name, _), rank in zip(targets, owner, strict=True) if rank == world.rank}
        # a shared Hessian is given up by this rank's last layer using it (the factorisation
        # then reuses its storage) and freed as soon as that layer is done
        last_user = {id(entries[n]): n for n, _ in targets if n in mine and entries[n] is not None}
        leaders: dict[int, str] = {}
        shares: dict[str, str | None] = {}
        done: dict[str, LayerResult] = {}
        for name, layer in targets:
            entry = entries.pop(name)
            leader = leaders.setdefault(id(entry), name) if entry is not None else name
            shares[name] = None if leader == name else leader
            if name not in mine:
                continue
            start = time.perf_counter()
            fallback = self._expert_fallback(layer, entry)
            with self._measure(layer) as peak:
                loss, baseline_loss = self._compress(
                    name,
                    layer,
                    entry.accumulator.H if entry and not fallback else None,
                    last_use=entry is not None and last_user[id(entry)] == name,
                    method=BASELINE[self.method] if fallback else self.method,
                )
            tokens = entry.accumulator.num_tokens if entry is not None else None
            del entry
            done[name] = LayerResult(
                name,
                loss,
                time.perf_counter() - start,
                shares[name],
                fallback,
                baseline_loss=baseline_loss,
                num_tokens=tokens,
                device_peak_bytes=peak.peak_bytes,
            )
        for (name, layer), rank in zip(targets, owner, strict=True):
            self.results.append(self._share(name, layer, rank, done.get(name)))
        few = [n for n, result in done.items() if result.fallback]
        if few:
            logger.warning(
                "%d expert projections (e.g. %s: %s) were compressed with %s instead of %s",
                len(few),
                few[0],
                done[few[0]].fallback,
                BASELINE[self.method],
                self.method,
            )

    def _measure(self, layer: LinearLayer) -> AbstractContextManager[PeakReading]:
        """Measure a solve's device peak when ``device_peaks`` is given."""
        if self.device_peaks is None:
            return nullcontext(PeakReading())
        return self.device_peaks.step(layer.module.weight.device)

    def _expert_fallback(self, layer: LinearLayer, entry: _SharedHessian | None) -> str | None:
        """Why an expert's Hessian is too thin to calibrate on (``None`` when it is not, or
        the layer is no expert): fewer than ``min_expert_tokens`` tokens reached it."""
        if self.method not in DATA_METHODS or not isinstance(layer.module, ExpertProjection):
            return None
        tokens = entry.accumulator.num_tokens if entry is not None else 0
        if tokens >= self.min_expert_tokens:
            return None
        return (
            f"{BASELINE[self.method]}: {tokens} routed token{'s' * (tokens != 1)}, "
            f"fewer than {self.min_expert_tokens}"
        )

    def _share(
        self, name: str, layer: LinearLayer, src: int, done: LayerResult | None
    ) -> LayerResult:
        """Give every rank the result rank ``src`` computed for ``name``: the weight left in
        the module and, when quantized, its integers; returns its :class:`LayerResult`.
        Only rank 0 keeps the integers (it alone writes the checkpoint)."""
        world = self.world
        if not world.distributed:
            assert done is not None
            return done
        quantized = self.quantized.get(name)
        shapes = None
        if quantized is not None:
            shapes = [(t.shape, t.dtype) if t is not None else None for t in _stored(quantized)]
        done, shapes = world.broadcast_object((done, shapes), src)
        weight = layer.matrix(layer.module.weight.dtype)
        world.broadcast([weight], src)
        layer.set_matrix(weight)
        if shapes is not None:
            if world.rank != src:  # empty tensors of the owner's shapes, to receive into
                int_weight, scale, zero_point, g_idx = (
                    torch.empty(*s[0], dtype=s[1]) if s else None for s in shapes
                )
                assert int_weight is not None and scale is not None and zero_point is not None
                assert self.scheme is not None
                quantized = QuantizedWeight(
                    None, int_weight, scale, zero_point, self.scheme.weights, g_idx
                )
            assert quantized is not None
            world.broadcast([t for t in _stored(quantized) if t is not None], src)
            if world.is_main:
                self.quantized[name] = quantized
            else:
                self.quantized.pop(name, None)
        assert done is not None
        return done

    def _compress(
        self,
        name: str,
        layer: LinearLayer,
        H: torch.Tensor | None,
        *,
        last_use: bool,
        method: str,
    ) -> tuple[float, float | None]:
        """Compress one layer with ``method``; its loss, and its baseline's on the same terms
        (``None`` for the methods without a Hessian, whose loss is 0)."""
        W = layer.matrix(self.storage_dtype or layer.module.weight.dtype)  # (out, in)
        args = self.scheme.weights if self.scheme is not None else None
        if method in DATA_METHODS and H is None:
            raise RuntimeError(f"{name} saw no calibration inputs; the pipeline did not run it")
        if method == GPTQ:
            assert args is not None and H is not None
            baseline = damped_error(W, baseline_weight(W, args), H)  # before H is overwritten
            result = gptq(
                W,
                H,
                args,
                blocksize=self.blocksize,
                percdamp=self.percdamp,
                refine_passes=self.refine_passes,
                overwrite_hessian=last_use,
                zeros=W == 0 if name in self.keep_zeros else None,
            )
            self._store(name, layer, result.quantized)
            return result.loss, baseline.loss(result.percdamp)
        if method == RTN:
            assert args is not None
            self._store(name, layer, rtn(W, args))
            return 0.0, None
        if method == SPARSEGPT:
            assert H is not None and self.sparsity is not None
            baseline = damped_error(W, baseline_weight(W, args, self.sparsity), H)
            pruned = sparsegpt(
                W,
                H,
                self.sparsity,
                quantize=args,
                blocksize=self.blocksize,
                percdamp=self.percdamp,
                overwrite_hessian=last_use,
            )
            layer.set_matrix(pruned.weight)
            if pruned.quantized is not None:
                self.quantized[name] = pruned.quantized.integers_only()
            return pruned.loss, baseline.loss(pruned.percdamp)
        if method == MAGNITUDE:
            assert self.sparsity is not None
            layer.set_matrix(baseline_weight(W, args, self.sparsity))
            return 0.0, None
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")

    def _store(self, name: str, layer: LinearLayer, quantized: QuantizedWeight) -> None:
        assert quantized.weight is not None
        layer.set_matrix(quantized.weight)
        # kept until the checkpoint is written: integers only (the module holds the dense
        # weight), on the host, or a GPU fills up layer by layer
        self.quantized[name] = quantized.integers_only()

    def on_subgraph_end(self, index: int, modules: NamedModules) -> None:
        for name, _ in modules:
            self._hessians.pop(name, None)


def _stored(quantized: QuantizedWeight) -> tuple[torch.Tensor | None, ...]:
    """The tensors of a quantized weight a checkpoint stores, in one fixed order."""
    return (quantized.int_weight, quantized.scale, quantized.zero_point, quantized.g_idx)


def _solve_cost(layer: LinearLayer) -> float:
    """Relative time of one GPTQ/SparseGPT solve: the factorisation (in^3) and the sweep
    (out x in x block, with in^2 x out for the lazy updates)."""
    return float(layer.in_features) ** 2 * (layer.in_features + layer.out_features)
