"""Freed tensors give their memory back to the OS once large blocks are mapped on their own."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

FRAGMENT = """
import re, sys, torch
from llmc_trace.core.host_memory import map_large_blocks
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
applied = map_large_blocks() if sys.argv[1] == "map" else False
big = torch.ones(5 * 2**20)  # 20 MB, mapped; freeing it raises glibc's threshold to 20 MB
del big
layer = torch.ones(2 * 2**20)  # 8 MB: from the heap unless the threshold stayed put
above = torch.ones(1000)  # something allocated after it, as a pipeline always has
before = rss()
del layer
print(applied, before - rss())
"""


#: glibc's mallopt and malloc_trim, and /proc to read the resident set
GLIBC_ON_LINUX = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not Path("/proc/self/status").exists(),
    reason="glibc's malloc and /proc (Linux)",
)


def child_output(fragment: str, mode: str, **env: str) -> list[str]:
    """What ``fragment`` prints in a fresh interpreter given ``mode``, with no ``MALLOC_``
    variable of ours in its environment (``env`` adds some)."""
    child = subprocess.run(
        [sys.executable, "-c", fragment, mode],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env,
    )
    return child.stdout.split()


def returned_bytes(mode: str, **env: str) -> tuple[str, int]:
    applied, freed = child_output(FRAGMENT, mode, **env)
    return applied, int(freed)


@GLIBC_ON_LINUX
def test_a_freed_layer_leaves_the_resident_set_only_when_large_blocks_are_mapped() -> None:
    layer_bytes = 8 * 2**20
    applied, freed = returned_bytes("map")
    assert applied == "True" and freed >= layer_bytes * 0.9
    assert returned_bytes("keep")[1] < layer_bytes * 0.1  # glibc's default keeps it
    # the environment's own threshold wins over ours
    applied, freed = returned_bytes("map", MALLOC_MMAP_THRESHOLD_=str(64 * 2**20))
    assert applied == "False" and freed < layer_bytes * 0.1


TRIM_FRAGMENT = """
import re, sys, torch
from llmc_trace.core.host_memory import map_large_blocks, release_free_memory
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
map_large_blocks()
hole = torch.ones(3 * 2**18)  # 3 MB, below the 4 MiB threshold: from the heap
above = torch.ones(3 * 2**18)  # as large: no free chunk below holds it, it goes above the hole
before = rss()
del hole  # a hole under `above`: free() cannot shrink the heap's top past it
if sys.argv[1] == "trim":
    release_free_memory()
print(before - rss())
"""


@GLIBC_ON_LINUX
def test_a_hole_below_the_threshold_leaves_the_resident_set_only_when_trimmed() -> None:
    hole_bytes = 3 * 2**20

    def returned(mode: str) -> int:
        (freed,) = child_output(TRIM_FRAGMENT, mode)
        return int(freed)

    assert returned("keep") < hole_bytes * 0.1
    assert returned("trim") >= hole_bytes * 0.9
