"""Resident-set measurements (Linux ``/proc``), shared by every benchmark and reference worker.

Standard library only, so the workers under ``_reference/`` (which run in the llm-compressor
venv and import nothing from llmc-trace) use the same arithmetic as the scripts that start them.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re


def resident_bytes() -> int:
    """The process's resident set now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_since_reset() -> int:
    """The kernel's resident high-water mark (VmHWM) since the last :func:`reset_peak_rss`."""
    with open("/proc/self/status") as status:
        match = re.search(r"VmHWM:\s+(\d+) kB", status.read())
    assert match is not None, "/proc/self/status has no VmHWM line"
    return int(match.group(1)) * 1024


def reset_peak_rss() -> int:
    """Return the resident set of live data, and restart the high-water mark from it.

    Freed memory is first handed back to the kernel (``malloc_trim``), so the baseline holds
    live data only. Raises ``OSError`` where ``/proc/self/clear_refs`` cannot be written.
    """
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    baseline = resident_bytes()
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return baseline
