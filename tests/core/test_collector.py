"""Building a model pauses the cyclic collector, and leaves it as it found it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from llmc_trace.core.collector import collector_paused
from llmc_trace.models.build import build_meta_model
from llmc_trace.models.source import resolve_model


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every automatic or explicit collection that starts meanwhile."""
    started: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield started
    finally:
        gc.callbacks.remove(record)


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_no_collection_inside_and_what_was_made_is_still_collectable_after(
    collections: list[int],
) -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(50_000)]  # allocations that would trigger collections
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle only the collector can free
        gone = weakref.ref(a)
        del a, b
    assert gc.isenabled() and collections == []
    # moved to the oldest generation unscanned: the next collections do not walk them all
    assert gc.get_count()[0] < gc.get_threshold()[0] and gc.get_freeze_count() == 0
    assert gone() is not None
    gc.collect()
    assert gone() is None and len(kept) == 50_000


def test_a_callers_collector_settings_are_kept() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # disabled before: not enabled by the pause
    finally:
        gc.enable()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            [[i] for i in range(1_000)]
        assert gc.get_freeze_count() == frozen  # a caller's frozen objects stay frozen
    finally:
        gc.unfreeze()


def test_building_a_model_runs_no_collection(collections: list[int]) -> None:
    """Unpaused, the build's allocations start collections (hundreds for a large model)."""
    source = resolve_model("meta-llama/Llama-3.1-70B")
    model = build_meta_model(source)
    assert collections == [] and gc.isenabled()
    assert sum(1 for _ in model.modules()) > 1_000  # objects enough to have triggered some
