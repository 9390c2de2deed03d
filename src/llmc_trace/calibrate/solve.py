"""Compress one layer from its Hessian with the stage's method, and record what it cost.

GPTQ, SparseGPT, round-to-nearest or magnitude pruning runs on the layer's ``(out, in)``
weight matrix (:mod:`llmc_trace.layers.linear`), and the result replaces the weight in the
module's own layout, so error propagation sees compressed outputs. An expert whose Hessian
holds fewer than ``min_expert_tokens`` tokens is compressed with the method's data-free
baseline instead, and its :class:`LayerResult` says so (never silently). A result holding NaN
or inf (from a finite weight and Hessian: a solver's bug) ends the run there, named. A solve on
the CPU hands its freed working memory back to the system before the next one starts
(:func:`~llmc_trace.core.host_memory.release_free_memory`).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch

from llmc_trace.algorithms.baseline import baseline_weight, damped_error
from llmc_trace.algorithms.gptq import gptq
from llmc_trace.algorithms.quantize import QuantizedWeight, rtn
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.algorithms.sparsegpt import Sparsity, sparsegpt
from llmc_trace.core.device_peak import DevicePeaks, PeakReading
from llmc_trace.core.finite import non_finite
from llmc_trace.core.host_memory import release_free_memory
from llmc_trace.core.solver import DEFAULTS, SolverSettings
from llmc_trace.core.names import BASELINE, DATA_METHODS, GPTQ, MAGNITUDE, METHODS, RTN, SPARSEGPT
from llmc_trace.errors import NonFiniteError
from llmc_trace.layers.linear import LinearLayer
from llmc_trace.moe import ExpertProjection
from llmc_trace.calibrate.hessians import SharedHessian


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


@dataclass(frozen=True)
class LayerSolver:
    """The stage's method and its settings, applied one layer at a time.

    ``scheme`` is ``None`` for pruning without quantization; ``sparsity`` is ``None`` for
    quantization without pruning. ``storage_dtype`` is the checkpoint's dtype: weights are
    compressed from (and scales computed in) that dtype whatever dtype the forward passes ran
    in, so the stored integers dequantize to exactly the weight left in the module.
    ``settings`` reach GPTQ and SparseGPT whole (:class:`~llmc_trace.core.solver.SolverSettings`).
    ``keep_zeros`` names layers an earlier stage pruned: GPTQ keeps their zeros (its sweep
    would otherwise fill them back in); round-to-nearest keeps them by itself (0 rounds to the
    zero point, which dequantizes to 0). ``device_peaks``, when given, measures each solve's
    CUDA peak. ``quantized`` collects each quantized layer's integers for the checkpoint.
    """

    method: str
    scheme: QuantizationScheme | None
    sparsity: Sparsity | None = None
    settings: SolverSettings = DEFAULTS
    storage_dtype: torch.dtype | None = None
    keep_zeros: frozenset[str] = frozenset()
    min_expert_tokens: int = 8
    device_peaks: DevicePeaks | None = None
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)

    def solve(
        self,
        name: str,
        layer: LinearLayer,
        hessian: SharedHessian | None,
        *,
        last_use: bool,
        shares_with: str | None,
    ) -> LayerResult:
        """Compress ``layer`` from ``hessian`` (``None`` without data). ``last_use`` gives the
        Hessian up to the solve, which then factorises in its storage; ``shares_with`` names
        the layer whose Hessian this one shares, for the report."""
        start = time.perf_counter()
        fallback = self._expert_fallback(layer, hessian)
        method = BASELINE[self.method] if fallback else self.method
        with self._measure(layer) as peak:
            loss, baseline_loss = self._compress(
                name,
                layer,
                hessian.accumulator.H if hessian and not fallback else None,
                last_use=last_use,
                method=method,
            )
        if layer.module.weight.device.type == "cpu":  # its working memory was the host's
            release_free_memory()
        problem = non_finite(layer.module.weight)
        if problem is not None:
            raise NonFiniteError(
                f"{method} made a weight holding {problem} for {name}, from finite inputs.",
                hint="Please report it, with the command and the model; nothing was written.",
                location=name,
            )
        return LayerResult(
            name,
            loss,
            time.perf_counter() - start,
            shares_with,
            fallback,
            baseline_loss=baseline_loss,
            num_tokens=hessian.accumulator.num_tokens if hessian is not None else None,
            device_peak_bytes=peak.peak_bytes,
        )

    def _measure(self, layer: LinearLayer) -> AbstractContextManager[PeakReading]:
        """Measure a solve's device peak when ``device_peaks`` is given."""
        if self.device_peaks is None:
            return nullcontext(PeakReading())
        return self.device_peaks.step(layer.module.weight.device)

    def _expert_fallback(self, layer: LinearLayer, hessian: SharedHessian | None) -> str | None:
        """Why an expert's Hessian is too thin to calibrate on (``None`` when it is not, or
        the layer is no expert): fewer than ``min_expert_tokens`` tokens reached it."""
        if self.method not in DATA_METHODS or not isinstance(layer.module, ExpertProjection):
            return None
        tokens = hessian.accumulator.num_tokens if hessian is not None else 0
        if tokens >= self.min_expert_tokens:
            return None
        return (
            f"{BASELINE[self.method]}: {tokens} routed token{'s' * (tokens != 1)}, "
            f"fewer than {self.min_expert_tokens}"
        )

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
            result = gptq(
                W,
                H,
                args,
                self.settings,
                overwrite_hessian=last_use,
                zeros=W == 0 if name in self.keep_zeros else None,
                baseline=True,  # measured before H is overwritten, with GPTQ's own scales
            )
            self._store(name, layer, result.quantized)
            return result.loss, result.baseline_loss
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
                settings=self.settings,
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
