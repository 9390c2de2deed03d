"""Compare two partitioned traces up to their number of layers.

Verification runs on the tiny twin, not the full model; the proof carries over only if both
traces have the same structure: the same operations in the head and in the tail, and the same
*kinds* of layer subgraph (a dense layer, an MoE layer, a sliding-window layer...). Module
paths are compared with their layer numbers erased.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import fx

from llmc_trace.graph.subgraph import Subgraph


@dataclass(frozen=True)
class StructureCheck:
    """Does the tiny twin's trace have the full model's structure (up to layer count)?"""

    matches: bool
    differences: list[str]


_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|_\d+$")


def node_signature(node: fx.Node) -> str:
    if node.op == "call_module":
        return f"module:{_NUMBER.sub('#', str(node.target))}"
    if node.op in ("call_function", "call_method"):
        return f"{node.op}:{getattr(node.target, '__name__', node.target)}"
    return node.op


def subgraph_signature(subgraph: Subgraph) -> tuple[str, ...]:
    return tuple(
        node_signature(n) for n in subgraph.graph.nodes if n.op not in ("placeholder", "output")
    )


def compare_structure(full: list[Subgraph], twin: list[Subgraph]) -> StructureCheck:
    """Head, tail and the set of layer-subgraph kinds must agree."""
    differences: list[str] = []
    if not full or not twin:
        return StructureCheck(False, ["one of the traces has no subgraphs"])
    full_sigs = [subgraph_signature(s) for s in full]
    twin_sigs = [subgraph_signature(s) for s in twin]
    has_head = not full[0].targets
    if has_head and full_sigs[0] != twin_sigs[0]:
        differences.append(_diff("head subgraph", full_sigs[0], twin_sigs[0]))
    if full_sigs[-1] != twin_sigs[-1]:
        differences.append(_diff("last subgraph", full_sigs[-1], twin_sigs[-1]))
    start = 1 if has_head else 0
    full_kinds = {sig: s for sig, s in zip(full_sigs[start:-1], full[start:-1])}
    twin_kinds = {sig: s for sig, s in zip(twin_sigs[start:-1], twin[start:-1])}
    for sig, subgraph in full_kinds.items():
        if sig not in twin_kinds and sig != full_sigs[-1]:
            differences.append(
                f"the full model's subgraph {subgraph.index} ({', '.join(subgraph.targets)}) has "
                "no counterpart in the twin, so verification does not cover it"
            )
    for sig, subgraph in twin_kinds.items():
        if sig not in full_kinds and sig not in (full_sigs[-1], full_sigs[0]):
            differences.append(
                f"the twin's subgraph {subgraph.index} ({', '.join(subgraph.targets)}) does not "
                "occur in the full model"
            )
    return StructureCheck(not differences, differences)


def _diff(what: str, full: tuple[str, ...], twin: tuple[str, ...]) -> str:
    for i, (a, b) in enumerate(zip(full, twin)):
        if a != b:
            return f"{what} differs at operation {i}: full model has {a}, twin has {b}"
    return f"{what} differs in length: full model {len(full)} operations, twin {len(twin)}"
