"""Byte counts as people read them: one formatter for tables, pictures and reports."""

from __future__ import annotations


def human_bytes(count: float) -> str:
    """``1717986918`` -> ``"1.6 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")
