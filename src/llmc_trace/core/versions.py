"""Release numbers of the libraries llmc-trace works around, compared as (major, minor).

A few behaviours depend on a dependency's release (an interpreter that cannot run with a
newer numpy, a loader that cannot read a checkpoint kind yet); each check names the release
that changed it, and compares with :func:`release`.
"""

from __future__ import annotations

import re


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.6.0', '2.5.0rc1' or '2.11.0+cu130'."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def dotted(numbers: tuple[int, int]) -> str:
    """A (major, minor) release as people write it: (5, 23) -> '5.23'."""
    return ".".join(map(str, numbers))
