"""Recognise operations that write into their first argument (in-place tensor updates)."""

from __future__ import annotations

import operator

import torch
from torch import fx


def is_mutation(node: fx.Node) -> bool:
    """True for operations that write into their first argument."""
    if node.op == "call_method":
        name = str(node.target)
        return name.endswith("_") and not name.endswith("__")
    if node.op == "call_function":
        if node.target in (operator.setitem, torch.Tensor.__setitem__):
            return True
        return "out" in node.kwargs
    return False
