"""Resume points: where a pipeline leaves its state after each finished part, to continue
from there after an interruption.

A sequential pipeline's whole state between two parts (subgraphs, or targets in
layer_sequential) is what enters the next part: the intermediates cache, or the captured
calls. A pipeline given :class:`ResumePoints` hands that state to :meth:`~ResumePoints.save`
after each part it finished (its weights already handed on), and, when
:meth:`~ResumePoints.start` says an earlier run got that far, takes it back from
:meth:`~ResumePoints.restore` instead of running those parts again: the parts after it then
see the values they would have seen, bit for bit. Where the state goes (disk, with what
else) is the caller's business.
"""

from __future__ import annotations

from typing import Any, Protocol


class ResumePoints(Protocol):
    """What a resumable pipeline calls (see the module docstring)."""

    def start(self, pipeline: str) -> int:
        """The parts an interrupted run of ``pipeline`` finished (0: start from the
        beginning); the pipeline says its name, which the saved state is kept under."""
        ...

    def restore(self) -> Any:
        """The state saved when the interrupted run had finished :meth:`start`'s parts."""
        ...

    def save(self, finished: int, state: Any) -> None:
        """Keep ``state``, the pipeline's once ``finished`` parts are done."""
        ...


STATE_OVERHEAD = 64 << 10
"""Bytes a rank's saved state holds besides its cache, about: the file's framing, the
compressor's results so far and the manifest (a few hundred bytes per compressed layer, which
only a model of many thousand layers brings near this)."""


def resume_point_bytes(cache_bytes: int, ranks: int) -> int:
    """Disk a run's resume points take at their largest, for a pipeline whose cache peaks at
    ``cache_bytes`` on each of ``ranks``: every rank's state, twice (a new point is complete on
    disk before the one it replaces is removed)."""
    return 2 * ranks * (cache_bytes + STATE_OVERHEAD)
