"""Package attributes imported when first used (PEP 562), so that importing a package costs
nothing until one of its names is read: ``llmc-trace --help`` answers without torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for the names in ``where`` (name -> the
    module defining it)."""
    names = sorted(where)

    def get(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def listed() -> list[str]:
        return names

    return get, listed
