"""Fixes for an untraceable model, each proven by re-tracing and verifying.

Tried in this order, each only when it applies to the failure at hand:

(a) **ignore** the smallest module that contains the failing code and holds no sequential
    target: it becomes one leaf, so its code is never traced;
(b) **opaque** call: record the function or method that contains the failing line as one
    graph node (it runs for real at calibration time, with whatever batch arrives);
(c) **autowrap**: rewrite only the failing statement into a function recorded as one call
    (see :mod:`~llmc_trace.diagnose.autowrap`), leaving the rest of the forward traced;
(d) a traceable definition from ``tracing_models/`` registered for the model class.

A fix never changes numerics: it is accepted only if the subgraphs replayed afterwards equal
the eager forward (on the tiny twin). What a fix costs is said in words, e.g. that a vision
tower's Linear layers now sit in one subgraph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.tracing.targets import LeafPlan


@dataclass(frozen=True)
class Fix:
    """One candidate fix: what to add to ``ignore`` (or which statement to rewrite)."""

    kind: str  # "ignore", "opaque", "autowrap" or "tracing_model"
    ignore: tuple[str, ...]
    description: str
    cost: str = ""


def ignore_fix(failure: TraceFailure, model: torch.nn.Module, leaves: LeafPlan) -> Fix | None:
    """(a): the innermost module on the failure's stack that is not an ancestor of a target."""
    for path, cls in reversed(failure.module_stack):
        if path and path not in leaves.ancestors:
            module = model.get_submodule(path)
            linears = sum(isinstance(m, torch.nn.Linear) for m in module.modules())
            params = sum(p.numel() * p.element_size() for p in module.parameters())
            return Fix(
                "ignore",
                (f"re:{re.escape(path)}",),
                f"keep {path} ({cls}) as one leaf module",
                f"{path} runs as one call: its {linears} Linear layers "
                f"({params / 2**20:.1f} MiB) share one subgraph and are calibrated together",
            )
    return None


def opaque_fix(failure: TraceFailure, model: torch.nn.Module) -> Fix | None:
    """(b): the innermost enclosing function that is not a module's ``forward``."""
    classes = {type(m).__name__ for m in model.modules()}
    for frame in reversed(failure.call_stack):
        qualified = frame.function
        if "<" in qualified:  # lambdas, comprehensions, nested functions: not addressable
            continue
        owner, _, name = qualified.rpartition(".")
        if name == "forward":
            continue  # an ancestor's forward cannot be opaque: it would swallow targets
        if owner and owner.split(".")[-1] in classes:
            return Fix(
                "opaque",
                (f"{owner.split('.')[-1]}.{name}",),
                f"record {owner.split('.')[-1]}.{name} as one opaque call",
                f"{name} runs as one graph node; modules it calls are not split out",
            )
        if not owner:
            return Fix(
                "opaque",
                (name,),
                f"record {name}() as one opaque call",
                f"{name} runs as one graph node; modules it calls are not split out",
            )
    return None


def candidate_fixes(failure: TraceFailure, model: torch.nn.Module, leaves: LeafPlan) -> list[Fix]:
    """Fixes that apply to ``failure``, in the order they are tried."""
    candidates = [ignore_fix(failure, model, leaves), opaque_fix(failure, model)]
    return [fix for fix in candidates if fix is not None]
