"""Byte counts: of values, of parameters, and as people read and write them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.errors import BadInputError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's dtype and shape, known before (or without) its values."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


def parameter_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the model's floating-point parameters (``None`` if it has none): what a
    checkpoint of it stores, and its scales are computed in."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def value_bytes(value: Any) -> int:
    """Bytes of every tensor in ``value`` (a tensor, or dicts, lists and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(value_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(value_bytes(v) for v in value)
    return 0


def parameter_bytes(modules: list[torch.nn.Module], dtype_bytes: int | None = None) -> int:
    """Bytes of the parameters ``modules`` hold themselves, a tied parameter counted once; at
    ``dtype_bytes`` per element when given (a plan for another dtype), else as stored."""
    return sum(_each_parameter_bytes(modules, dtype_bytes))


def largest_parameter_bytes(modules: list[torch.nn.Module], dtype_bytes: int | None = None) -> int:
    """Bytes of the largest parameter ``modules`` hold themselves (see :func:`parameter_bytes`)."""
    return max(_each_parameter_bytes(modules, dtype_bytes), default=0)


def _each_parameter_bytes(modules: list[torch.nn.Module], dtype_bytes: int | None) -> list[int]:
    unique = {id(p): p for m in modules for p in m.parameters(recurse=False)}
    return [p.numel() * (dtype_bytes or p.element_size()) for p in unique.values()]


def parameter_bytes_by_path(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of the parameters under every module path; a tied parameter counts once per path."""
    totals: dict[str, int] = {}
    counted: set[tuple[str, int]] = set()
    for name, parameter in model.named_parameters(remove_duplicate=False):
        size = parameter.numel() * parameter.element_size()
        parts = name.split(".")[:-1]
        for depth in range(len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if (prefix, id(parameter)) not in counted:  # only dedupes; never orders output
                counted.add((prefix, id(parameter)))
                totals[prefix] = totals.get(prefix, 0) + size
    return totals


def human_bytes(count: float) -> str:
    """``1717986918`` -> ``"1.6 GiB"``. The next unit starts at 1000, not 1024, so a figure
    never takes four digits ("1002.0 MiB" reads as "1.0 GiB") and table columns stay narrow."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1000 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str, param: str | None = None) -> int:
    """``"80GiB"`` -> ``85899345920``; decimal (GB) and binary (GiB) units, or plain bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise BadInputError(
            f"{text!r} is not a memory size.",
            hint="Write a number with a unit, e.g. 80GiB, 24GB or 512MiB.",
            param=param,
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
