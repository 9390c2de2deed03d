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


def reads_before_binding(
    statements: list[ast.stmt], bound: frozenset[str] = frozenset()
) -> tuple[set[str], frozenset[str]]:
    """The names ``statements`` may read before they bind them themselves (what must come in
    from outside), and the names bound on every path through them (what is sure to go out).

    ``if x: t = f(); y = g(t)`` reads ``x`` only: ``t`` is bound before it is read on every
    path that reads it, and an earlier ``t`` that a branch not taken never bound must not be
    passed in. A loop's body may not run, so what it binds is not sure; names bound in one
    pass and read before binding in the next were read before binding in the first pass."""
    reads: set[str] = set()
    for statement in statements:
        more, bound = _flow(statement, bound)
        reads |= more
    return reads, bound


def _flow(statement: ast.stmt, bound: frozenset[str]) -> tuple[set[str], frozenset[str]]:
    """:func:`reads_before_binding` of one statement."""
    if isinstance(statement, ast.If):
        test = statement_names([statement.test])
        bound = bound | set(test.binds)
        body_reads, body_bound = reads_before_binding(statement.body, bound)
        else_reads, else_bound = reads_before_binding(statement.orelse, bound)
        return (set(test.reads) - bound) | body_reads | else_reads, body_bound & else_bound
    if isinstance(statement, (ast.For, ast.AsyncFor)):
        head = statement_names([statement.iter])
        target = statement_names([statement.target])
        body_reads, _ = reads_before_binding(statement.body, bound | set(target.binds))
        else_reads, _ = reads_before_binding(statement.orelse, bound)
        return (set(head.reads) - bound) | body_reads | else_reads, bound
    if isinstance(statement, ast.While):
        test = statement_names([statement.test])
        body_reads, _ = reads_before_binding(statement.body, bound)
        else_reads, _ = reads_before_binding(statement.orelse, bound)
        return (set(test.reads) - bound) | body_reads | else_reads, bound
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        items = statement_names([item.context_expr for item in statement.items])
        targets = statement_names([i.optional_vars for i in statement.items if i.optional_vars])
        body_reads, body_bound = reads_before_binding(
            statement.body, bound | set(targets.binds) | set(items.binds)
        )
        return (set(items.reads) - bound) | body_reads, body_bound
    if isinstance(statement, ast.Try):
        body_reads, body_bound = reads_before_binding(statement.body, bound)
        reads = set(body_reads)
        for handler in statement.handlers:
            caught = {handler.name} if handler.name else set()
            reads |= reads_before_binding(handler.body, bound | caught)[0]
            if handler.type is not None:
                reads |= set(statement_names([handler.type]).reads) - bound
        reads |= reads_before_binding(statement.orelse, body_bound)[0]
        final_reads, final_bound = reads_before_binding(statement.finalbody, bound)
        return reads | final_reads, final_bound  # any line of the body may have raised
    names = statement_names([statement])  # simple statements read, then bind
    return set(names.reads) - bound, bound | set(names.binds)


#: Attributes and methods that read a tensor's shape, dtype or device, never its values.
_SHAPE_READS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda"})
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "ndimension"})


def shape_only_names(statement: ast.stmt, names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` that ``statement`` reads only for their shape, dtype or device
    (``x.shape``, ``x.size(1)``, ``len(x)``): a check like ``if out.size() != (b, n, d):
    raise ...`` moved into a recorded call passes ``out`` in, yet no value of it reaches the
    call's results."""
    parents = {
        id(child): node for node in ast.walk(statement) for child in ast.iter_child_nodes(node)
    }

    def shape_read(name: ast.Name) -> bool:
        parent = parents.get(id(name))
        if isinstance(parent, ast.Attribute) and parent.value is name:
            if parent.attr in _SHAPE_READS:
                return True
            call = parents.get(id(parent))
            return (
                parent.attr in _SHAPE_METHODS and isinstance(call, ast.Call) and call.func is parent
            )
        return (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Name)
            and parent.func.id == "len"
            and parent.args == [name]
        )

    uses: dict[str, list[ast.Name]] = {}
    for node in ast.walk(statement):
        if isinstance(node, ast.Name) and node.id in names:
            uses.setdefault(node.id, []).append(node)
    return tuple(
        name
        for name in names
        if uses.get(name) and all(isinstance(u.ctx, ast.Load) and shape_read(u) for u in uses[name])
    )
