"""Fixes for an untraceable model, each proven by re-tracing and verifying.

The fix searched for is an **opaque** call: the innermost function or method around the
failing line that is not a module's ``forward`` is recorded as one graph node, which runs for
real at calibration time with whatever batch arrives.

Ignoring a module is never needed as a fix here: the leaf rule already keeps every module that
holds no sequential target out of the trace, so a failure can only occur in a target's
ancestor, which cannot be ignored without hiding the targets.

A fix never changes numerics: it is accepted only if the subgraphs replayed afterwards equal
the eager forward (on the tiny twin). What a fix costs is said in words, e.g. that a vision
tower's Linear layers now sit in one subgraph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmc_trace.diagnose.failure import TraceFailure


@dataclass(frozen=True)
class Fix:
    """One candidate fix: what to add to ``ignore`` (or which statement to rewrite)."""

    kind: str  # "opaque"
    ignore: tuple[str, ...]
    description: str
    cost: str = ""


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


def candidate_fixes(failure: TraceFailure, model: torch.nn.Module) -> list[Fix]:
    """Fixes that apply to ``failure``, in the order they are tried."""
    candidates = [opaque_fix(failure, model)]
    return [fix for fix in candidates if fix is not None]
