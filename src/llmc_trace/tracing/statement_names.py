"""Which local names a piece of a function reads and binds, from its AST.

Autowrap (:mod:`~llmc_trace.tracing.rewrite`) moves a statement into a function of its own:
the function's parameters are the locals the statement reads that exist before it, and its
results the locals it binds or mutates that are read after it. This module answers the two
questions for any statement, counting in-place mutation (``x[i] = v``, ``x.add_(...)``) as a
binding, since whoever reads ``x`` later must see the change.
"""

from __future__ import annotations

import ast


class StatementNames(ast.NodeVisitor):
    """Locals read and bound by a statement, in order of first appearance.

    Names bound inside a nested scope (a lambda's parameters, a comprehension's targets, a
    nested ``def``'s body) belong to that scope; names read there may still be the enclosing
    function's locals and count as reads.
    """

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.binds: list[str] = []
        self._nested = 0

    def _add(self, names: list[str], name: str) -> None:
        if name not in names:
            names.append(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) or isinstance(node.ctx, ast.Del):
            self._add(self.reads, node.id)
        elif not self._nested:
            self._add(self.binds, node.id)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._add(self.reads, node.target.id)
        self.generic_visit(node)
        self._store_base(node.target)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        method = node.func
        if (
            isinstance(method, ast.Attribute)
            and method.attr.endswith("_")
            and not method.attr.startswith("__")
        ):
            self._store_base(method.value)  # x.add_(...), x.masked_fill_(...): x changes

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._add(self.binds, node.target.id)  # binds in the function even in a comprehension

    def _store_base(self, target: ast.expr) -> None:
        """``x[i] = v`` and ``x.a = v`` mutate ``x``: later readers must depend on this call."""
        while isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        if isinstance(target, ast.Name) and not self._nested:
            self._add(self.binds, target.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            for element in ast.walk(target):
                if isinstance(element, (ast.Subscript, ast.Attribute)) and isinstance(
                    element.ctx, ast.Store
                ):
                    self._store_base(element)

    def _visit_nested(self, node: ast.AST) -> None:
        self._nested += 1
        self.generic_visit(node)
        self._nested -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._add(self.binds, node.name)
        self._visit_nested(node)

    visit_Lambda = _visit_nested
    visit_ListComp = _visit_nested
    visit_SetComp = _visit_nested
    visit_DictComp = _visit_nested
    visit_GeneratorExp = _visit_nested


def statement_names(nodes: list[ast.AST]) -> StatementNames:
    """The locals ``nodes`` read and bind, together (see :class:`StatementNames`)."""
    visitor = StatementNames()
    for node in nodes:
        visitor.visit(node)
    return visitor
