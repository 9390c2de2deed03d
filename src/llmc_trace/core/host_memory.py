"""Make the memory of freed tensors go back to the operating system (glibc's malloc).

glibc serves an allocation from its heap unless it is at least ``M_MMAP_THRESHOLD`` bytes, which
it maps on its own and unmaps when freed. The threshold starts at 128 KiB but, by default, rises
to the size of every mapped block that is freed (up to 32 MiB). A pipeline frees its first
layer's weights, Hessians and activations (megabytes to tens of megabytes each), so from then
on blocks of those sizes come from the heap, where freed holes stay resident as long as
anything lives above them. The resident set then creeps up layer after layer although the live
bytes do not: 4 against 16 layers of a 768-wide Llama grew the peak by 10 to 90 MB from run to
run (2 MB with the threshold fixed), and the 0.4B bf16 Llama of ``benchmarks/compress_scale.py``
peaked 962 MiB above its imports (610 MiB with the threshold fixed at 1 MiB). A fixed threshold
turns the adjustment off: every block from ``threshold`` up is mapped and returned on free, and
the peak follows the live bytes. 4 MiB keeps the small per-block temporaries of a column sweep
on the heap, where reusing them costs no page faults; the 0.4B run took as long either way.

Setting ``MALLOC_MMAP_THRESHOLD_`` in the environment does the same; when it is set, it wins.

Below the threshold, freed blocks stay resident until :func:`release_free_memory` hands their
pages back (glibc's ``malloc_trim``). The pipelines call it between subgraphs, and a CPU solve
calls it when it returns: the seven solves of a decoder layer leave their float32 copies,
Hessian factors and block temporaries as holes between the integers and weights they keep,
and the next solve's differently sized blocks do not fit them. Trimming after each solve
lowered the 0.1B Llama's peak growth from 171-192 to 162-164 MiB (0.4B: 383-389 to
370-371 MiB) for about 2.5 ms a call, 0.4 % of its solves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

#: ``mallopt``'s parameter number for the mmap threshold (glibc's malloc.h).
_M_MMAP_THRESHOLD = -3


def map_large_blocks(threshold: int = 4 * 2**20) -> bool:
    """Have glibc map every allocation of ``threshold`` bytes or more on its own, for the rest
    of the process. Returns whether it applies: False off Linux, on a libc without ``mallopt``
    (musl), or when ``MALLOC_MMAP_THRESHOLD_`` already decides."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; elsewhere a
    no-op), so that what a finished step freed does not count towards the next step's peak."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


@functools.cache
def _libc_function(name: str) -> Any:
    """The C library's function ``name``, or None where there is no such library or function
    (macOS and Windows have no ``malloc_trim``, musl no ``mallopt``)."""
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name, None) if library else None
    except OSError:
        return None
