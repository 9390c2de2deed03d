"""Find the ``if``/``elif``/``while``/``for``/ternary that a conditional jump of model code decides.

The decision recorder (:mod:`~llmc_trace.tracing.decisions`) sees bytecode: a conditional jump
at an offset, and the instruction execution went on at. This module maps both back to the
source with the code object's positions (line and column of every instruction) and the file's
syntax tree: the innermost branching construct whose condition holds the jump is the decision,
and whether the next instruction lies in its body, its ``else`` or its condition (an ``and``
still being evaluated) is the branch taken.
"""

from __future__ import annotations

import ast
import dis
import functools
import linecache
from dataclasses import dataclass
from types import CodeType

#: Jumps that decide something: Python 3.11's conditional jumps and the loop step.
_DECIDING = frozenset(
    {
        "POP_JUMP_FORWARD_IF_FALSE",
        "POP_JUMP_FORWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_FORWARD_IF_NONE",
        "POP_JUMP_FORWARD_IF_NOT_NONE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
        "POP_JUMP_IF_FALSE",
        "POP_JUMP_IF_TRUE",
        "POP_JUMP_IF_NONE",
        "POP_JUMP_IF_NOT_NONE",
        "JUMP_IF_FALSE_OR_POP",
        "JUMP_IF_TRUE_OR_POP",
        "FOR_ITER",
    }
)

Span = tuple[int, int, int, int]  # (line, end line, column, end column), as co_positions gives


@dataclass(frozen=True)
class Branching:
    """One branching construct of a source file.

    ``kind`` is ``if``, ``elif``, ``while``, ``for``, ``ternary`` or ``assert`` (an ``and`` or
    ``or`` outside them computes a value, and is left out);
    ``condition`` the expression that decides it (a loop's iterable); ``body`` and ``orelse``
    the line ranges of its branches (``None`` where there is none). ``span`` is what a jump
    deciding it is located at: the condition, or the whole construct for ternaries and loops.
    """

    kind: str
    line: int
    span: Span
    condition: ast.expr
    body: tuple[int, int] | None
    orelse: tuple[int, int] | None
    body_span: Span | None
    orelse_span: Span | None
    statement: Span | None = None  # the whole statement: some jumps are located at it


def deciding_offsets(code: CodeType) -> dict[int, int]:
    """Offset of every deciding jump in ``code`` -> the offset it jumps to."""
    return _deciding_offsets(code)


@functools.lru_cache(maxsize=8192)
def _deciding_offsets(code: CodeType) -> dict[int, int]:
    return {
        instruction.offset: instruction.argval
        for instruction in dis.get_instructions(code)
        if instruction.opname in _DECIDING
    }


@functools.lru_cache(maxsize=8192)
def positions(code: CodeType) -> tuple[tuple[int | None, ...], ...]:
    """The source span of each code unit of ``code`` (index = offset // 2)."""
    return tuple(code.co_positions())


@functools.lru_cache(maxsize=256)
def syntax_tree(filename: str) -> ast.Module | None:
    """The parsed source of ``filename`` (``None`` when it cannot be read)."""
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def branchings(filename: str) -> tuple[Branching, ...]:
    """Every branching construct of ``filename`` (empty when its source cannot be read)."""
    tree = syntax_tree(filename)
    if tree is None:
        return ()
    lines = linecache.getlines(filename)
    found: list[Branching] = []
    for node in ast.walk(tree):
        found.extend(_branchings_of(node, lines))
    return tuple(found)


def _span(node: ast.AST) -> Span:
    return (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset)  # type: ignore[attr-defined,return-value]


def _stmts_span(statements: list[ast.stmt]) -> Span | None:
    if not statements:
        return None
    first, last = statements[0], statements[-1]
    return (first.lineno, last.end_lineno, first.col_offset, last.end_col_offset)  # type: ignore[return-value]


def _lines(span: Span | None) -> tuple[int, int] | None:
    return None if span is None else (span[0], span[1])


def _branchings_of(node: ast.AST, lines: list[str]) -> list[Branching]:
    if isinstance(node, (ast.If, ast.While)):
        kind = "while" if isinstance(node, ast.While) else "if"
        if kind == "if" and lines[node.lineno - 1].lstrip().startswith("elif"):
            kind = "elif"
        body, orelse = _stmts_span(node.body), _stmts_span(node.orelse)
        return [
            Branching(
                kind,
                node.lineno,
                _span(node.test),
                node.test,
                _lines(body),
                _lines(orelse),
                body,
                orelse,
                _span(node),
            )
        ]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        body, orelse = _stmts_span(node.body), _stmts_span(node.orelse)
        header: Span = (node.lineno, node.end_lineno, node.col_offset, node.end_col_offset)  # type: ignore[assignment]
        return [
            Branching(
                "for", node.lineno, header, node.iter, _lines(body), _lines(orelse), body, orelse
            )
        ]
    if isinstance(node, ast.IfExp):
        body, orelse = _span(node.body), _span(node.orelse)
        return [
            Branching(
                "ternary",
                node.lineno,
                _span(node),
                node.test,
                _lines(body),
                _lines(orelse),
                body,
                orelse,
            )
        ]
    if isinstance(node, ast.Assert):
        return [
            Branching("assert", node.lineno, _span(node.test), node.test, None, None, None, None)
        ]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        span = _span(node)
        return [
            Branching("for", node.lineno, span, generator.iter, None, None, None, None)
            for generator in node.generators
        ][:1]
    return []


def _contains(outer: Span, inner: Span) -> bool:
    if None in inner:
        return False
    starts_before = (outer[0], outer[2]) <= (inner[0], inner[2])
    ends_after = (outer[1], outer[3]) >= (inner[1], inner[3])
    return starts_before and ends_after


def _size(span: Span) -> tuple[int, int]:
    return (span[1] - span[0], span[3] - span[2] if span[0] == span[1] else 10**6)


def branching_at(filename: str, span: Span) -> Branching | None:
    """The innermost construct of ``filename`` whose deciding span holds ``span`` (a jump's);
    the jumps of an ``and``/``or`` inside a condition are steps of that condition's decision."""
    holding = [(b.span, b) for b in branchings(filename) if _contains(b.span, span)]
    holding += [
        (b.statement, b)
        for b in branchings(filename)
        if b.statement is not None and b.line == span[0] and _contains(b.statement, span)
    ]
    if not holding:
        return None
    return min(holding, key=lambda item: _size(item[0]))[1]


def branch_taken(branching: Branching, destination: Span, jumped: bool) -> str | None:
    """Which branch execution went on to: ``then``/``else`` (``iterate``/``exit`` for loops),
    or ``None`` when it is still evaluating the condition (the left side of an ``and``)."""
    if branching.kind == "for":
        return "exit" if jumped else "iterate"
    if branching.body_span is not None and _contains(branching.body_span, destination):
        return "iterate" if branching.kind == "while" else "then"
    if branching.orelse_span is not None and _contains(branching.orelse_span, destination):
        return "else"
    if _contains(branching.span, destination):
        return None
    if branching.kind == "while":
        return "exit"
    if branching.kind == "assert":
        return "held" if not jumped else "failed"
    return "else"
