"""``compress``'s seconds and device peaks per phase, measured from outside the library.

The phases, in the order they run: ``load`` and ``trace`` (reported by ``compress``'s progress
labels); per decoder layer, ``forwards`` (the calibration passes, reading the cached inputs
included), ``hessians`` (``HessianAccumulator.add`` inside them), ``solves`` (the compressor
solving the layer's Linears, ``LayerCompressor.on_calibrated``), ``propagate_compute`` (the
passes on the compressed layer) and ``propagate_copy`` (inside them, moving the cached hidden
states to the device and the outputs back to the host); and ``write``. The nested ones
(Hessians, solves, copies) are timed by wrapping those methods, each synchronised with the
device at its start and end so that the seconds are the device's; their seconds are taken off
the phase around them.

Each phase's device peak is CUDA's allocated high-water mark over the phase, read and reset at
every boundary (``torch.cuda.max_memory_allocated``, through the library's ``reset_peak``); the
resets the library makes inside a phase (one per solve) hand the meter the mark they clear
(``observing_resets``), so a layer's solves peak at their largest, not at their last. Off CUDA
no peak is read. Wrapping the library's methods here, in a benchmark, is the measurement's
business: the library itself keeps no timers in its maths.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from common import synchronize
from llmc_trace.algorithms.hessian import HessianAccumulator
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.core.device_peak import observing_resets, reset_peak
from llmc_trace.pipelines.cache import IntermediatesCache

#: every phase, in the order a run goes through them
PHASES = (
    "load",
    "trace",
    "forwards",
    "hessians",
    "solves",
    "propagate_compute",
    "propagate_copy",
    "write",
)
#: which estimated phase of the plan (``PipelineEstimate.device_phases``) holds each measured
#: one's peak
PLAN_PHASE = {
    "forwards": "calibrate",
    "hessians": "calibrate",
    "solves": "solve",
    "propagate_compute": "propagate",
    "propagate_copy": "propagate",
}


class PhaseMeter:
    """A progress reporter for ``compress`` that times and measures its phases (see the module
    docstring); ``save(phases_s)`` is called at each new label, so a step killed mid-run
    still leaves its phases."""

    def __init__(self, save: Callable[[dict[str, float]], None], device: torch.device) -> None:
        self.save = save
        self.device = device
        self.phases_s: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        self._label: str | None = None
        self._phase: str | None = None
        self._since = time.perf_counter()
        self._nested_s = 0.0  # seconds of nested phases since the label began
        self._inside = False
        self._cleared = 0  # the highest mark another reset cleared since the last reading

    @staticmethod
    def phase(label: str) -> str:
        """The phase a progress label belongs to."""
        if label.startswith("subgraph"):
            return "propagate_compute" if label.endswith("propagate") else "forwards"
        return label

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self._label:
            self.close()
            self._label, self._phase = label, self.phase(label)
            self.save(self.phases_s)

    def close(self) -> None:
        """Give the time since the last label, less its nested phases, to the label's phase."""
        now = time.perf_counter()
        if self._phase is not None:
            self._add(self._phase, now - self._since - self._nested_s)
            self._read_peak(self._phase)
        self._since, self._nested_s = now, 0.0

    @contextmanager
    def nested(self, name: str) -> Iterator[None]:
        """Time a nested phase (one level: a nested phase inside another is the outer's)."""
        if self._inside:
            yield
            return
        synchronize(self.device)
        self._read_peak(self._phase)
        self._inside = True
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            seconds = time.perf_counter() - start
            self._inside = False
            self._add(name, seconds)
            self._nested_s += seconds
            self._read_peak(name)

    @contextmanager
    def instrumented(self) -> Iterator[None]:
        """The library's methods wrapped for the nested phases while the block runs."""

        def wrap(owner: type, method: str, name: str, when: str | None = None) -> Any:
            original = getattr(owner, method)

            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                if when is not None and self._phase != when:
                    return original(*args, **kwargs)
                with self.nested(name):
                    return original(*args, **kwargs)

            setattr(owner, method, timed)
            return lambda: setattr(owner, method, original)

        with ExitStack() as restore:
            restore.enter_context(observing_resets(self._observe_reset))
            restore.callback(wrap(HessianAccumulator, "add", "hessians"))
            restore.callback(wrap(LayerCompressor, "on_calibrated", "solves"))
            for method in ("fetch", "replace"):
                copy = wrap(IntermediatesCache, method, "propagate_copy", "propagate_compute")
                restore.callback(copy)
            yield
        self.close()

    def _add(self, phase: str, seconds: float) -> None:
        self.phases_s[phase] = self.phases_s.get(phase, 0.0) + seconds

    def _observe_reset(self, device: torch.device, mark: int) -> None:
        if device.type == self.device.type:  # one GPU: "cuda" and "cuda:0" are the same one
            self._cleared = max(self._cleared, mark)

    def _read_peak(self, phase: str | None) -> None:
        """Give the high-water mark since the last reading to ``phase``, and start anew."""
        if self.device.type != "cuda":
            return
        if phase is None:  # before the first label: nothing to give it to
            self._cleared = 0
            return
        peak = max(torch.cuda.max_memory_allocated(self.device), self._cleared)
        self.peaks[phase] = max(self.peaks.get(phase, 0), peak)
        reset_peak(self.device)
        self._cleared = 0  # after the reset, which handed this meter the mark it just read


def phase_peaks_against_plan(
    peaks: dict[str, int], planned: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Per estimated phase: the plan's bytes, the largest measured peak among the phases it
    covers (``PLAN_PHASE``), and their ratio (None where either is missing)."""
    rows = {}
    for estimated, plan_bytes in planned.items():
        measured = [peaks[p] for p, e in PLAN_PHASE.items() if e == estimated and p in peaks]
        peak = max(measured) if measured else None
        rows[estimated] = {
            "plan_bytes": plan_bytes,
            "peak_bytes": peak,
            "peak_over_plan": peak / plan_bytes if peak is not None and plan_bytes else None,
        }
    return rows
