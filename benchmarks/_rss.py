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


def library_code_bytes() -> int:
    """Resident bytes of the shared libraries' files mapped into the process (``.so``).

    A library's kernels page in the first time they run: a pipeline's first layer pages in the
    matmul, factorisation and quantization code it calls (9.5 MiB of ``libtorch_cpu.so`` on
    ``compress_scale``'s 0.1B Llama), the same at every model size. Those pages belong to the
    files, are shared, and the kernel drops and re-reads them under pressure: no memory a plan
    estimates, yet the resident set counts them. Subtracting their growth over a pipeline from
    its resident growth leaves what its data took.
    """
    total = 0
    library = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            field = line.split(maxsplit=1)[0]
            if not field.endswith(
                ":"
            ):  # a mapping's header: range, perms, offset, dev, inode, path
                parts = line.split()
                library = len(parts) > 5 and ".so" in parts[5].rsplit("/", 1)[-1]
            elif field == "Rss:" and library:
                total += int(line.split()[1]) * 1024
    return total
