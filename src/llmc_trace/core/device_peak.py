"""Measure the device memory each step of a run peaks at, keeping the peak of the whole run.

CUDA counts one high-water mark per process (``torch.cuda.max_memory_allocated``); a step's own
peak needs it reset before the step (``reset_peak_memory_stats``), which loses the mark of
everything before. Every reset in the process therefore goes through :func:`reset_peak`, which
first hands the mark it is about to lose to every live observer: :class:`DevicePeaks` (each
run's, so ``run_peak_bytes`` is what one reading at the end would have given without any reset)
and whoever else measures phases (:func:`observing_resets`; the GPU benchmark's phase meter),
since a reset by one measurer would erase what another has not read: a meter's resets would
hide a run's forward peaks from its report, and the solver's per-solve resets would leave the
meter only a layer's last solve. Only CUDA is measured: a CPU process has no peak it could
reset for one step without disturbing other measurements of its resident set.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

#: called with the device and its mark just before the mark is reset
PeakObserver = Callable[[torch.device, int], None]
_observers: list[PeakObserver] = []
_runs: weakref.WeakSet[DevicePeaks] = weakref.WeakSet()  # each live run's, observing too


def reset_peak(device: torch.device) -> None:
    """Start CUDA's high-water mark on ``device`` anew, first giving the mark to every observer
    (see the module docstring)."""
    mark = torch.cuda.max_memory_allocated(device)
    for run in tuple(_runs):
        run._keep(mark)
    for observe in tuple(_observers):
        observe(device, mark)
    torch.cuda.reset_peak_memory_stats(device)


@contextmanager
def observing_resets(observe: PeakObserver) -> Iterator[None]:
    """Have ``observe`` given the mark before every reset while the block runs."""
    _observers.append(observe)
    try:
        yield
    finally:
        _observers.remove(observe)


@dataclass
class PeakReading:
    """A step's peak allocated bytes on its device, once the step is done; None off CUDA."""

    peak_bytes: int | None = None


@dataclass(eq=False)
class DevicePeaks:
    """Per-step CUDA peaks (see the module docstring) and the run's peak across them; observes
    every reset in the process for as long as it lives."""

    run_peak_bytes: int | None = None

    def __post_init__(self) -> None:
        _runs.add(self)

    @contextmanager
    def step(self, device: torch.device) -> Iterator[PeakReading]:
        """Measure the block's peak on ``device``: CUDA's mark is reset on entry and read on
        exit into the yielded reading (left None for any other device)."""
        reading = PeakReading()
        if device.type != "cuda":
            yield reading
            return
        reset_peak(device)
        try:
            yield reading
        finally:
            reading.peak_bytes = torch.cuda.max_memory_allocated(device)
            self._keep(reading.peak_bytes)

    def current(self, device: torch.device) -> int | None:
        """The run's peak so far, including what the counter holds since the last reset."""
        if device.type == "cuda":
            self._keep(torch.cuda.max_memory_allocated(device))
        return self.run_peak_bytes

    def _keep(self, peak_bytes: int) -> None:
        self.run_peak_bytes = max(self.run_peak_bytes or 0, peak_bytes)
