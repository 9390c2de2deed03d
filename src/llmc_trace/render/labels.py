"""Short, machine-independent text for graph values, sizes and index sets.

Every string here ends up in an SVG or HTML file that must be byte-identical from run to run
and from machine to machine, so nothing may carry an object address, an absolute path or a
set's iteration order: objects other than plain values are named by their class only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from llmc_trace.core.sizes import value_bytes
from llmc_trace.tracing.tracer import op_name
from llmc_trace.core.sizes import human_bytes

#: Longest text kept for one value; graphviz boxes grow with their widest line.
MAX_TEXT = 60
_ADDRESS = re.compile(r"( at)? 0x[0-9a-fA-F]{6,}")


def describe_value(value: Any, depth: int = 0) -> str:
    """``[1, 32, 8192] bfloat16`` for a tensor; containers list their first few items."""
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, torch.Size):
        return f"size {list(value)}"
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, (bool, int, float, str, type(None))):
        return shorten(repr(value))
    if depth >= 2:
        return type(value).__name__
    if isinstance(value, dict):
        items = [f"{k}: {describe_value(v, depth + 1)}" for k, v in list(value.items())[:4]]
        more = ", …" if len(value) > 4 else ""
        prefix = "" if type(value) is dict else type(value).__name__
        return shorten(f"{prefix}{{{', '.join(items)}{more}}}")
    if isinstance(value, (tuple, list)):
        items = [describe_value(v, depth + 1) for v in value[:4]]
        more = ", …" if len(value) > 4 else ""
        open_, close = ("(", ")") if isinstance(value, tuple) else ("[", "]")
        return shorten(f"{open_}{', '.join(items)}{more}{close}")
    return type(value).__name__  # never repr(): it may hold an address


def stable_text(text: str) -> str:
    """``text`` without object addresses (``<Foo object at 0x7f...>``), which differ per run."""
    return _ADDRESS.sub("", text)


def shorten(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def index_ranges(indices: Iterable[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"#1–3, #5"``: subgraph sets stay one line on an 80-layer model."""
    ordered = sorted(set(indices))
    runs: list[tuple[int, int]] = []
    for index in ordered:
        if runs and index == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return ", ".join(f"#{a}" if a == b else f"#{a}–{b}" for a, b in runs)


def node_operation(node: fx.Node) -> str:
    """What a node does, as people search for it: ``linear``, ``size``, ``model.layers.3``."""
    if node.op == "call_function" and op_name(node.target) == "getattr" and len(node.args) > 1:
        return f"getattr .{node.args[1]}"
    return op_name(node.target)


def node_fields(node: fx.Node) -> list[tuple[str, str]]:
    """The facts a side panel shows for one graph node, in a fixed order."""
    fields = [("name", node.name), ("op", node.op), ("target", node_operation(node))]
    module_path = node.meta.get("module_path")
    if module_path is not None:
        fields.append(("module path", module_path or "(root)"))
        fields.append(("module class", str(node.meta.get("module_class") or "")))
    if "val" in node.meta:
        fields.append(("value", describe_value(node.meta["val"])))
        size = value_bytes(node.meta["val"])
        if size:
            fields.append(("bytes", human_bytes(size)))
    source = node.meta.get("source")
    # placeholders and attributes are created by the caller, not by model code
    if source is not None and node.op not in ("placeholder", "get_attr"):
        fields.append(("source", f"{source.file}:{source.line} in {source.function}"))
        fields.append(("code", shorten(source.code, 120)))
    return fields
