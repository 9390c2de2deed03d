"""The progress callback: library code reports its steps, only the CLI draws them."""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(stage, done, total)``: ``stage`` says what runs now (``"trace"``,
#: ``"subgraph 3/29 · model.layers.2"``, ``"rows"``), ``done`` of ``total`` steps are complete.
Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """The reporter for callers that want none."""
