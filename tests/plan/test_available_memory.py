"""The free device memory a plan is made against, with CUDA simulated on the CPU."""

from __future__ import annotations

import pytest
import torch

from llmc_trace.plan.memory import available_device_memory

GIB = 2**30


def test_blocks_the_caching_allocator_holds_unallocated_count_as_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first run in the process left 6 GiB reserved, 2 GiB of it still allocated: the driver
    reports 10 GiB free, and the next run can use 14."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * GIB)
    assert available_device_memory(device_is_host=False) == 14 * GIB
