"""Recognise operations that write into their first argument (in-place tensor updates).

One rule for the tracer (which refuses an in-place write into the model's own weights) and
for the partitioner (which orders every read of a value around the writes into it).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

#: In-place operators that reach the graph as functions (``x += y``, ``x[i] = y``).
IN_PLACE_FUNCTIONS = frozenset(
    {
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.setitem,
        torch.Tensor.__setitem__,
    }
)


def writes_in_place(kind: str, target: Any, kwargs: Mapping[str, Any]) -> bool:
    """True for a ``call_method`` or ``call_function`` that writes into its first argument:
    ``x.add_(y)`` (a public method ending in ``_``), an in-place operator, or ``out=``."""
    if kind == "call_method":
        return isinstance(target, str) and target.endswith("_") and not target.startswith("_")
    if kind == "call_function":
        return target in IN_PLACE_FUNCTIONS or "out" in kwargs
    return False


def is_mutation(node: fx.Node) -> bool:
    """True for graph nodes that write into their first argument."""
    return writes_in_place(node.op, node.target, node.kwargs)
