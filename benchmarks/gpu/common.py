"""What every measuring step of the GPU run shares: its deadline, device timing, its result file.

A step runs in a process of its own (``step.py``), started by ``run.py`` with a spec (a JSON
file) and a hard timeout. The timeout only guarantees the run goes on; a step that overruns it
loses what it measured. So each step also watches its own :class:`Deadline` and stops starting
new work that the remaining seconds cannot hold, recording what it skipped, and writes its
result file after every unit of work (:func:`write_result`), so a step killed at its timeout
still leaves what it finished.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

GiB = 2**30


class Deadline:
    """Seconds left before a step must be done, from its start."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._start = time.perf_counter()

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._start

    def left_s(self) -> float:
        return self.budget_s - self.elapsed_s()

    def allows(self, needed_s: float) -> bool:
        """Whether work expected to take ``needed_s`` ends before the deadline."""
        return needed_s <= self.left_s()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: CUDA runs asynchronously, so a host clock read
    without this measures the launch, not the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(work: Callable[[], Any], device: torch.device, repeats: int = 5) -> dict[str, Any]:
    """``repeats`` timed runs of ``work`` after one untimed warm-up: their median (the figure
    a verdict reads), fastest and slowest, the spread (slowest over fastest, minus one: how
    far one timing alone could have been off), every run's seconds, and CUDA's allocated
    high-water mark over the runs (None off CUDA)."""
    work()
    synchronize(device)
    if device.type == "cuda":
        # imported here: step.py imports this module before any step, and a step that cannot
        # import llmc-trace must still fail on its own, not take the versions step with it
        from llmc_trace.core.device_peak import reset_peak

        reset_peak(device)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        synchronize(device)
        runs.append(time.perf_counter() - start)
    ordered = sorted(runs)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {
        "median_s": median,
        "min_s": ordered[0],
        "max_s": ordered[-1],
        "spread": ordered[-1] / ordered[0] - 1,
        "runs_s": runs,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Replace the step's result file with ``result`` (temporary file, then rename: a step
    killed mid-write leaves the previous version, never half a file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=1, sort_keys=True))
    os.replace(partial, path)
