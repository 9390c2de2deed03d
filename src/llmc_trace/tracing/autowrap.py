"""Autowrap: record a failing statement of model code as one graph call, for one trace.

The opaque fix records a whole helper function; a statement written directly in a module's
``forward`` has no helper to record, and that ``forward`` cannot be opaque when it calls the
sequential targets. Autowrap moves the statement into a function of its own (see
:mod:`~llmc_trace.tracing.rewrite`) and records every call of that function as one
``call_function`` node, so the statement runs for real at calibration time.

An autowrap is named in ``ignore`` like any other fix, as
``autowrap:<function qualname>@<line>`` (``autowrap:Gemma4ForConditionalGeneration.forward@2692``),
so recipes, the command line and the trace cache carry it unchanged. It is installed only
while a trace runs: the function's ``__code__`` is swapped and the extracted functions are
placed in its module's globals, and both are restored afterwards. No file is edited, and
eager calls outside the trace run the original code.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.errors import BadInputError
from llmc_trace.tracing.rewrite import ExtractedStatement, RewriteRefused, rewrite_function
from llmc_trace.tracing.source import display_path

PREFIX = "autowrap:"


@dataclass(frozen=True)
class StatementRewrite:
    """A statement that autowrap moves into its own function, as a fix reports it."""

    entry: str  # the ``ignore`` entry that installs it
    file: str  # display path of the model file
    function: str  # qualified name of the function holding the statement
    line: int
    parameters: list[str]
    passes_receiver: bool  # the method's ``self`` goes into the extracted function
    before: str
    after: str

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def autowrap_entry(function: str, line: int) -> str:
    """The ``ignore`` entry for the statement at ``line`` of ``function`` (a qualified name)."""
    return f"{PREFIX}{function}@{line}"


def is_autowrap_entry(entry: str) -> bool:
    return entry.startswith(PREFIX)


def parse_entry(entry: str) -> tuple[str, int]:
    """``autowrap:Cls.forward@12`` -> ``("Cls.forward", 12)``; bad input raises."""
    function, _, line = entry[len(PREFIX) :].rpartition("@")
    if not function or not line.isdigit():
        raise BadInputError(
            f"The ignore entry {entry!r} is not of the form 'autowrap:<function>@<line>'.",
            hint="Copy it from `llmc-trace attempt --fix`, e.g. 'autowrap:MyModel.forward@120'.",
            param="tracing_ignore",
        )
    return function, int(line)


def find_function(model: torch.nn.Module, qualname: str, line: int) -> types.FunctionType | None:
    """The function named ``qualname`` whose code spans ``line``, as the model's code uses it.

    Methods are looked up on the classes (and bases) of the model's modules, module-level
    functions in the files defining those classes. Decorators are seen through by following
    ``__wrapped__``, so the function found is the one whose code runs.
    """
    owner, _, name = qualname.rpartition(".")
    seen: set[int] = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if id(cls) in seen:
                continue
            seen.add(id(cls))
            if owner and cls.__qualname__ == owner and name in vars(cls):
                candidate = vars(cls)[name]
            elif not owner:
                candidate = vars(sys.modules.get(cls.__module__, types.ModuleType("_"))).get(name)
            else:
                continue
            found = _unwrap_to(candidate, qualname, line)
            if found is not None:
                return found
    return None


def _unwrap_to(candidate: Any, qualname: str, line: int) -> types.FunctionType | None:
    candidate = getattr(candidate, "__func__", candidate)  # staticmethod, classmethod
    while candidate is not None:
        code = getattr(candidate, "__code__", None)
        if (
            isinstance(candidate, types.FunctionType)
            and code is not None
            and code.co_qualname == qualname
            and code.co_firstlineno <= line <= max(n for _, _, n in code.co_lines() if n)
        ):
            return candidate
        candidate = getattr(candidate, "__wrapped__", None)
    return None


def plan_rewrites(
    model: torch.nn.Module, entries: list[str]
) -> list[tuple[types.FunctionType, list[int]]]:
    """Group autowrap entries by the function they rewrite; unknown functions raise."""
    lines: dict[str, list[int]] = {}
    for entry in entries:
        function, line = parse_entry(entry)
        lines.setdefault(function, []).append(line)
    planned = []
    for qualname, function_lines in lines.items():
        function = find_function(model, qualname, function_lines[0])
        if function is None:
            raise BadInputError(
                f"The autowrap entry names {qualname}, which no class or module of "
                f"{type(model).__name__} defines at line {function_lines[0]}.",
                hint="The model code changed since the entry was made: run "
                "`llmc-trace attempt --fix` again for a current one.",
                param="tracing_ignore",
            )
        planned.append((function, function_lines))
    return planned


def describe(function: types.FunctionType, extracted: ExtractedStatement) -> StatementRewrite:
    qualname = function.__code__.co_qualname
    return StatementRewrite(
        entry=autowrap_entry(qualname, extracted.line),
        file=display_path(function.__code__.co_filename),
        function=qualname,
        line=extracted.line,
        parameters=list(extracted.parameters),
        passes_receiver=extracted.passes_receiver,
        before=extracted.before,
        after=extracted.after,
    )


@contextlib.contextmanager
def install_autowraps(
    model: torch.nn.Module,
    entries: list[str],
    record: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Iterator[list[StatementRewrite]]:
    """Rewrite the named statements for the duration of a trace; restore everything after.

    ``record(fn)`` returns what the rewritten code calls instead of ``fn``: a function that
    makes each call one graph node (``LlmcTracer.opaque_call``). Yields the rewrites made.
    """
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []
    placed: list[tuple[dict[str, Any], str, Any]] = []  # (globals, name, previous or sentinel)
    rewrites: list[StatementRewrite] = []
    missing = object()
    try:
        for function, lines in plan_rewrites(model, entries):
            try:
                rewritten = rewrite_function(function, lines)
            except RewriteRefused as err:
                raise BadInputError(
                    f"Autowrap cannot rewrite {function.__code__.co_qualname}: {err.message}",
                    hint="Drop the entry from ignore; `llmc-trace attempt --fix` tries others.",
                    param="tracing_ignore",
                ) from err
            namespace = function.__globals__
            for name, extracted in rewritten.extracted.items():
                placed.append((namespace, name, namespace.get(name, missing)))
                namespace[name] = record(extracted)
            swapped.append((function, function.__code__))
            function.__code__ = rewritten.code
            rewrites += [describe(function, s) for s in rewritten.statements]
        yield rewrites
    finally:
        for function, code in reversed(swapped):
            function.__code__ = code
        for namespace, name, previous in reversed(placed):
            if previous is missing:
                namespace.pop(name, None)
            else:
                namespace[name] = previous


def preview_rewrite(model: torch.nn.Module, qualname: str, line: int) -> StatementRewrite:
    """What autowrapping ``line`` of ``qualname`` would do, without installing it.

    Raises :class:`~llmc_trace.tracing.rewrite.RewriteRefused` with the reason it cannot.
    """
    function = find_function(model, qualname, line)
    if function is None:
        raise RewriteRefused(f"{qualname} is not a function the model's classes or files define.")
    [statement] = rewrite_function(function, [line]).statements
    return describe(function, statement)
