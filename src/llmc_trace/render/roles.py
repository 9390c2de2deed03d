"""What tracing does with each module (its role), and when two module subtrees are alike.

Every view colours modules by role, and folding compares subtrees by role as well as by
class: a layer holding an ignored router is not interchangeable with one that does not.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET, LEAF_TARGET, LeafPlan

#: Role -> (colour key, sentence shown in the legend and the side panel).
ROLES: dict[str, tuple[str, str]] = {
    "target": ("target", LEAF_TARGET),
    "ignored": ("ignored", LEAF_IGNORED),
    "ancestor": ("ancestor", "traced through (holds a sequential target)"),
    "leaf": ("leaf", f"leaf: {LEAF_NO_TARGET}"),
    "inside": ("inside", "inside a leaf, not traced"),
}


def module_role(plan: LeafPlan, path: str) -> str:
    """One of :data:`ROLES`: what tracing does with the module at ``path``."""
    reason = plan.leaf_reason(path)
    if reason == LEAF_TARGET:
        return "target"
    if reason == LEAF_IGNORED:
        return "ignored"
    if reason is None:
        return "ancestor"
    parent = path.rpartition(".")[0]
    return "leaf" if plan.leaf_reason(parent) is None else "inside"


def subtree_signature(
    module: torch.nn.Module, plan: LeafPlan, path: str, marked: Collection[str] = ()
) -> tuple[str, ...]:
    """Classes, relative paths and roles below ``path``: equal for interchangeable modules.

    A module in ``marked`` (the failure's stack) never looks like its siblings, so
    folding cannot hide it.
    """
    signature = []
    for name, sub in module.named_modules():
        full = f"{path}.{name}" if name else path
        mark = "!" if full in marked else ""
        signature.append(f"{name}:{type(sub).__name__}:{module_role(plan, full)}{mark}")
    return tuple(signature)
