"""Measure the device memory each step of a run peaks at, keeping the peak of the whole run.

CUDA counts one high-water mark per process (``torch.cuda.max_memory_allocated``); a step's own
peak needs it reset before the step (``reset_peak_memory_stats``), which loses the mark of
everything before. :class:`DevicePeaks` reads the mark before each reset and after each step,
so ``run_peak_bytes`` is what one reading at the end would have given without the resets.
Only CUDA is measured: a CPU process has no peak it could reset for one step without
disturbing other measurements of its resident set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class PeakReading:
    """A step's peak allocated bytes on its device, once the step is done; None off CUDA."""

    peak_bytes: int | None = None


@dataclass
class DevicePeaks:
    """Per-step CUDA peaks (see the module docstring) and the run's peak across them."""

    run_peak_bytes: int | None = None

    @contextmanager
    def step(self, device: torch.device) -> Iterator[PeakReading]:
        """Measure the block's peak on ``device``: CUDA's mark is reset on entry and read on
        exit into the yielded reading (left None for any other device)."""
        reading = PeakReading()
        if device.type != "cuda":
            yield reading
            return
        self._keep(torch.cuda.max_memory_allocated(device))
        torch.cuda.reset_peak_memory_stats(device)
        try:
            yield reading
        finally:
            reading.peak_bytes = torch.cuda.max_memory_allocated(device)
            self._keep(reading.peak_bytes)

    def current(self, device: torch.device) -> int | None:
        """The run's peak so far, including what the counter holds since the last step."""
        if device.type == "cuda":
            self._keep(torch.cuda.max_memory_allocated(device))
        return self.run_peak_bytes

    def _keep(self, peak_bytes: int) -> None:
        self.run_peak_bytes = max(self.run_peak_bytes or 0, peak_bytes)
