"""Fixtures for the checkpoint tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run each test module here on one CPU thread, restoring the setting afterwards.

    The column sweeps are thousands of tiny ops. On a shared 2-core machine, two OpenMP threads
    stall on every op whenever another process holds a core: a refmodel layer's GPTQ took
    1.9 s instead of 0.02 s. One thread keeps the suite's time independent of the neighbours.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
