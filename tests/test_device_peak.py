"""One CUDA high-water mark serves every measurer in a process: a reset by one must not erase
what another has not read. Simulated on the CPU with a counter in CUDA's place."""

from __future__ import annotations

import gc

import pytest
import torch

from llmc_trace.core import device_peak
from llmc_trace.core.device_peak import DevicePeaks, observing_resets, reset_peak

CUDA = torch.device("cuda:0")


class FakeCounter:
    """CUDA's allocated-bytes high-water mark: ``peak(n)`` allocates n bytes for a moment."""

    def __init__(self) -> None:
        self.mark = 0

    def peak(self, nbytes: int) -> None:
        self.mark = max(self.mark, nbytes)

    def max_memory_allocated(self, device: object = None) -> int:
        return self.mark

    def reset_peak_memory_stats(self, device: object = None) -> None:
        self.mark = 0


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> FakeCounter:
    fake = FakeCounter()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", fake.max_memory_allocated)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    return fake


def test_a_runs_peak_keeps_a_mark_another_measurer_reset(counter: FakeCounter) -> None:
    run = DevicePeaks()
    counter.peak(900)  # a forward pass
    reset_peak(CUDA)  # another measurer starts a phase
    counter.peak(300)
    assert run.current(CUDA) == 900


def test_each_step_reads_its_own_peak_and_the_run_the_largest(counter: FakeCounter) -> None:
    run = DevicePeaks()
    counter.peak(700)
    readings = []
    for nbytes in (300, 500, 200):
        with run.step(CUDA) as reading:
            counter.peak(nbytes)
        readings.append(reading.peak_bytes)
    assert readings == [300, 500, 200]
    assert run.current(CUDA) == 700


def test_an_observer_is_given_each_mark_before_it_is_cleared(counter: FakeCounter) -> None:
    marks: list[int] = []
    run = DevicePeaks()
    with observing_resets(lambda device, mark: marks.append(mark)):
        for nbytes in (300, 500, 200):
            with run.step(CUDA):
                counter.peak(nbytes)
    reset_peak(CUDA)  # after the block: no longer observed
    assert marks == [0, 300, 500]  # each solve's reset hands on the mark before it


def test_a_finished_run_stops_observing() -> None:
    before = len(device_peak._runs)
    run = DevicePeaks()
    assert run in device_peak._runs
    del run
    gc.collect()
    assert len(device_peak._runs) == before
