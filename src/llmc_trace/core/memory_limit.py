"""The memory a limit leaves this process: a cgroup's (a container's, a job scheduler's) or the
address-space limit (``ulimit -v``).

The memory plan compares its host peak with the memory available; the machine's figure
(``psutil``) knows nothing of a limit set on the process, and a run that exceeds its cgroup's
is killed by the OOM killer hours in, one that exceeds ``ulimit -v`` fails an allocation. The
tighter of the two limits, less what is already in use under it, is what a run can count on.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

_UNLIMITED = 1 << 60
"""Limits at or above this are cgroups' ways of writing "none" (v1 writes 2**63 rounded)."""


@dataclass(frozen=True)
class MemoryLimit:
    """A limit on this process's memory: what it leaves free, and which limit it is."""

    available_bytes: int
    limit_bytes: int
    source: str


def memory_limit(cgroup_root: Path = Path("/sys/fs/cgroup")) -> MemoryLimit | None:
    """The limit that leaves this process the least memory; ``None`` when none is set."""
    limits = [limit for limit in (_cgroup(cgroup_root), _address_space()) if limit is not None]
    return min(limits, key=lambda limit: limit.available_bytes, default=None)


def _cgroup(root: Path) -> MemoryLimit | None:
    """The cgroup's limit as this process's cgroup namespace shows it: v2's ``memory.max``
    and ``memory.current``, or v1's ``memory.limit_in_bytes`` and ``memory.usage_in_bytes``."""
    for limit_file, usage_file, source in (
        (root / "memory.max", root / "memory.current", "cgroup memory.max"),
        (
            root / "memory" / "memory.limit_in_bytes",
            root / "memory" / "memory.usage_in_bytes",
            "cgroup memory.limit_in_bytes",
        ),
    ):
        try:
            text = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if text == "max" or not text.isdigit() or int(text) >= _UNLIMITED:
            return None
        return MemoryLimit(max(0, int(text) - usage), int(text), source)
    return None


def _address_space() -> MemoryLimit | None:
    """``ulimit -v`` (``RLIMIT_AS``), less the address space this process already maps."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft >= _UNLIMITED:
        return None
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    mapped = pages * resource.getpagesize()
    return MemoryLimit(max(0, soft - mapped), soft, "ulimit -v")
