"""Fixes for an untraceable model, each proven by re-tracing and verifying.

Tried in this order, each as an entry in ``tracing_ignore`` so a recipe can carry it:

* **opaque**: the innermost function or method around the failing line that is not a
  module's ``forward`` is recorded as one graph node, which runs for real at calibration
  time with whatever batch arrives;
* **autowrap**: the failing statement itself (an ``if`` on a traced value, a loop, an
  ``assert``, a line calling a shape-dependent helper) is moved into a function of its own
  and recorded as one node (:mod:`~llmc_trace.tracing.autowrap`); this reaches statements
  written directly in a ``forward``, which cannot be opaque when it calls the targets;
* **definition**: a traceable subclass registered in ``tracing_models/`` for a class of the
  model, for what neither of the above can fix.

Ignoring a module is never needed as a fix here: the leaf rule already keeps every module that
holds no sequential target out of the trace, so a failure can only occur in a target's
ancestor, which cannot be ignored without hiding the targets.

A fix never changes numerics: it is accepted only if the subgraphs replayed afterwards equal
the eager forward (on the tiny twin). What a fix costs is said in words, e.g. that a vision
tower's Linear layers now sit in one subgraph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from llmc_trace.core.deprecation import renamed
from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.tracing.autowrap import (
    StatementRewrite,
    autowrap_entry,
    is_autowrap_entry,
    parse_entry,
    preview_rewrite,
)
from llmc_trace.tracing.rewrite import RewriteRefused
from llmc_trace.tracing.definitions import (
    definition_class,
    definition_entry,
    definitions_for,
    is_definition_entry,
)


@dataclass(frozen=True)
class Fix:
    """One candidate fix: what to add to ``tracing_ignore``, and what it changes.

    ``rewrites`` hold the before/after source of each autowrapped statement (several for a
    seed from the sweep). A candidate with a ``refusal`` cannot be applied; the reason is
    reported instead of an outcome.
    """

    kind: str  # "opaque", "autowrap", "definition", or "swept" (a seed, see diagnose.search)
    tracing_ignore: tuple[str, ...]
    description: str
    cost: str = ""
    rewrites: tuple[StatementRewrite, ...] = ()
    refusal: str = ""

    @property
    def ignore(self) -> tuple[str, ...]:
        """Deprecated: :attr:`tracing_ignore` (removed in the next release)."""
        renamed("Fix.ignore", "Fix.tracing_ignore")
        return self.tracing_ignore


def opaque_fix(failure: TraceFailure, model: torch.nn.Module) -> Fix | None:
    """The opaque fix: the innermost enclosing function that is not a module's ``forward``."""
    classes = {type(m).__name__ for m in model.modules()}
    for frame in reversed(failure.call_stack):
        qualified = frame.function
        if "<" in qualified:  # lambdas, comprehensions, nested functions: not addressable
            continue
        owner, _, name = qualified.rpartition(".")
        if name == "forward":
            continue  # an ancestor's forward cannot be opaque: it would swallow targets
        if owner and owner.split(".")[-1] in classes:
            entry = f"{owner.split('.')[-1]}.{name}"
            return Fix("opaque", (entry,), *describe_entry(entry))
        if not owner:
            return Fix("opaque", (name,), *describe_entry(name))
    return None


def describe_entry(entry: str) -> tuple[str, str]:
    """What a ``tracing_ignore`` entry a fix adds does, and what it costs, in words."""
    if is_autowrap_entry(entry):
        function, line = parse_entry(entry)
        return (
            f"autowrap line {line} of {function}",
            f"the statement at line {line} runs as one graph node",
        )
    if is_definition_entry(entry):
        name = definition_class(entry)
        return (
            f"trace {name} by its definition in tracing_models/",
            f"{name} is traced through its traceable definition; eager runs keep the original",
        )
    name = entry.rpartition(".")[2]
    return (
        f"record {entry}{'' if '.' in entry else '()'} as one opaque call",
        f"{name} runs as one graph node; modules it calls are not split out",
    )


def as_rewritten(
    entries: tuple[str, ...], rewrites: tuple[StatementRewrite, ...]
) -> tuple[str, ...]:
    """``entries`` with each autowrap named as its rewrite names it, by the first line of the
    statement it moves: a sweep made on another transformers release may name a line inside
    that statement, which installs the same rewrite but reads as another fix. Unchanged where
    an entry found no rewrite (the fix is then refused when installed)."""
    if len(rewrites) != sum(map(is_autowrap_entry, entries)):
        return entries
    named = iter(rewrite.entry for rewrite in rewrites)
    return tuple(next(named) if is_autowrap_entry(entry) else entry for entry in entries)


def preview_rewrites(
    model: torch.nn.Module, entries: tuple[str, ...]
) -> tuple[StatementRewrite, ...]:
    """The before/after source of each autowrap entry in ``entries`` that applies to ``model``
    (one that does not is refused when the fix is installed, with its reason)."""
    rewrites = []
    for entry in filter(is_autowrap_entry, entries):
        try:
            rewrites.append(preview_rewrite(model, *parse_entry(entry)))
        except RewriteRefused:
            continue
    return tuple(rewrites)


def autowrap_fix(failure: TraceFailure, model: torch.nn.Module) -> Fix | None:
    """The autowrap fix: the failing statement, in the innermost frame that autowrap can address."""
    for frame in reversed(failure.call_stack):
        if "<" in frame.function:  # decorator wrappers, lambdas: no source to rewrite there
            continue
        entry = autowrap_entry(frame.function, frame.line)
        description = f"autowrap {frame.file}:{frame.line} in {frame.function}"
        try:
            rewrite = preview_rewrite(model, frame.function, frame.line)
        except RewriteRefused as err:
            return Fix("autowrap", (entry,), description, refusal=err.message)
        if failure.module_path == "" and rewrite.passes_receiver:
            return Fix(
                "autowrap",
                (entry,),
                description,
                rewrites=(rewrite,),
                refusal="the statement reads `self` of the root module, which a graph "
                "cannot pass to a call as a value",
            )
        # named by the statement's first line, as the rewrite reports it (the failing line
        # may be inside a statement of several lines)
        entry = rewrite.entry
        return Fix("autowrap", (entry,), description, describe_entry(entry)[1], (rewrite,))
    return None


def definition_fixes(model: torch.nn.Module) -> list[Fix]:
    """The definition fixes: the traceable definitions registered in ``tracing_models/`` for the model's classes."""
    entries = [definition_entry(name) for name in definitions_for(model)]
    return [Fix("definition", (entry,), *describe_entry(entry)) for entry in entries]


#: Why neither an opaque call nor autowrap can fix a write into the model's own weights.
WEIGHT_WRITE_REFUSAL = (
    "the code writes into the model's own weights; recorded as one graph call, the write "
    "would repeat on every calibration batch"
)


def candidate_fixes(failure: TraceFailure, model: torch.nn.Module) -> list[Fix]:
    """Fixes that apply to ``failure``, in the order they are tried.

    A ``weight_mutation`` is never fixed by recording the code that writes: the graph node
    would rescale (or otherwise change) the weights once per batch, and a twin whose write
    happens to be exact (a factor of 1) would not notice. Only a definition can remove it.
    """
    candidates = [opaque_fix(failure, model), autowrap_fix(failure, model)]
    fixes = [fix for fix in candidates if fix is not None]
    if failure.kind == "weight_mutation":
        fixes = [replace(fix, refusal=WEIGHT_WRITE_REFUSAL) for fix in fixes]
    return fixes + definition_fixes(model)
