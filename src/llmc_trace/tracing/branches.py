"""The branching constructs of model source: each ``if``, ``elif``, ``while``, ``for``, ternary and ``assert``.

A :class:`Branching` is what the decision recorder knows of one construct before it runs: where
it is, its condition (a loop's iterable) as source text, and the lines of its branches, so that
a view can grey the branch the trace never took. :func:`branching_of` makes one from a syntax
tree node; :mod:`~llmc_trace.tracing.instrument` calls it on every construct of a model file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

Lines = tuple[int, int]  # first and last line, inclusive


@dataclass(frozen=True)
class Branching:
    """One branching construct of a source file.

    ``kind`` is ``if``, ``elif``, ``while``, ``for``, ``ternary`` or ``assert``; ``line`` the
    line it starts on; ``condition`` the source of the expression that decides it (a loop's
    iterable) and ``condition_lines`` the lines it spans; ``body`` and ``orelse`` the line
    ranges of its branches (``None`` where there is none).
    """

    kind: str
    line: int
    condition: str
    condition_lines: Lines
    body: Lines | None
    orelse: Lines | None

    def condition_tree(self) -> ast.expr:
        """The condition parsed again (kept as text so a cached file needs no syntax tree)."""
        return ast.parse(self.condition, mode="eval").body


def branching_of(node: ast.AST, lines: list[str]) -> Branching | None:
    """The construct ``node`` is, or ``None`` when it decides nothing."""
    if isinstance(node, (ast.If, ast.While)):
        kind = "while" if isinstance(node, ast.While) else "if"
        if kind == "if" and lines[node.lineno - 1].lstrip().startswith("elif"):
            kind = "elif"
        test = node.test
        return Branching(
            kind,
            node.lineno,
            ast.unparse(test),
            _lines([test]),  # type: ignore[arg-type]
            _lines(node.body),
            _lines(node.orelse),
        )
    if isinstance(node, (ast.For, ast.AsyncFor)):
        header = (node.lineno, node.iter.end_lineno or node.iter.lineno)
        return Branching(
            "for",
            node.lineno,
            ast.unparse(node.iter),
            header,
            _lines(node.body),
            _lines(node.orelse),
        )
    if isinstance(node, ast.IfExp):
        body, orelse = _lines([node.body]), _lines([node.orelse])
        if body == orelse == (node.lineno, node.lineno):
            body = orelse = None  # both on the construct's own line: nothing to grey
        test = node.test
        return Branching("ternary", node.lineno, ast.unparse(test), _lines([test]), body, orelse)  # type: ignore[arg-type]
    if isinstance(node, ast.Assert):
        test = node.test
        return Branching("assert", node.lineno, ast.unparse(test), _lines([test]), None, None)  # type: ignore[arg-type]
    if isinstance(node, ast.comprehension):
        source = node.iter
        return Branching("for", source.lineno, ast.unparse(source), _lines([source]), None, None)  # type: ignore[arg-type]
    return None


def _lines(nodes: list[ast.stmt] | list[ast.expr]) -> Lines | None:
    """The lines ``nodes`` span, first to last."""
    if not nodes:
        return None
    return (nodes[0].lineno, nodes[-1].end_lineno or nodes[-1].lineno)
