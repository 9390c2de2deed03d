"""A pytest plugin that keeps only the tests a machine without CUDA never runs.

Loaded with ``-p cuda_selection``: a test is kept when it carries the ``cuda`` marker, or a
``skipif`` marker whose reason names CUDA or a GPU (the suite's way to skip cleanly without
one); every other collected test is deselected. On a GPU machine the kept tests are the ones
no CI run has exercised; on a CPU they all skip, which proves the selection without a GPU.
"""

from __future__ import annotations

import re

import pytest

NEEDS_DEVICE = re.compile(r"\b(cuda|gpu)\b", re.IGNORECASE)


def needs_cuda(item: pytest.Item) -> bool:
    if item.get_closest_marker("cuda") is not None:
        return True
    return any(
        NEEDS_DEVICE.search(str(marker.kwargs.get("reason", "")))
        for marker in item.iter_markers("skipif")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [item for item in items if needs_cuda(item)]
    dropped = [item for item in items if not needs_cuda(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
