"""Move statements of a function into functions of their own, by rewriting its source's AST.

A statement that asks a question of a traced value (``if hidden.shape[1] == ids.shape[1]:``,
a loop over a grid, an ``assert``) fails only while it is *traced*. Moved into a function of
its own and called from the rewritten original, it becomes one graph call (see
:mod:`~llmc_trace.tracing.autowrap`) and runs for real, on real data, at calibration time.

The extracted function takes the locals bound before the statement that it reads before
binding them (or returns, not binding them on every path), and returns the locals it binds
(or mutates) that are read after it, so the rewritten function computes exactly what the
original did. The result is a new *code object* for the original function: installed by
swapping ``__code__``, it reaches the function through every decorator wrapping it, and the
file on disk is never touched. Line numbers are the file's, so a later
failure still points at the model's own line.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmc_trace.errors import LlmcTraceError
from llmc_trace.tracing.statement_names import (
    reads_before_binding,
    shape_only_names,
    statement_names,
)

#: Prefix of every extracted function's name (``_llmc_autowrap_forward_L2692``).
EXTRACTED_PREFIX = "_llmc_autowrap_"
_RESULTS = "_llmc_results"

#: Attribute of an extracted function: the positions of the arguments it reads only for their
#: shape, dtype or device, whose values therefore reach none of its results (a graph read for
#: its dataflow, as the smoothing pairs are, may pass through such an argument).
SHAPE_ONLY = "llmc_shape_only_arguments"


class RewriteRefused(LlmcTraceError):
    """A statement cannot be moved into a function without changing what the code does."""


@dataclass(frozen=True)
class ExtractedStatement:
    """One statement moved into its own function: what was there, and what replaces it."""

    name: str  # the new function's name
    line: int  # first line of the statement in its file
    parameters: tuple[str, ...]  # locals it reads, bound before it
    results: tuple[str, ...]  # locals it binds that are read after it
    passes_receiver: bool  # the method's ``self`` is the first parameter
    before: str  # the statement as written
    after: str  # the new function, then the statement that replaces the original
    #: parameters it reads only for their shape, dtype or device (see :data:`SHAPE_ONLY`)
    shape_only: tuple[str, ...] = ()


@dataclass(frozen=True)
class RewrittenFunction:
    """A replacement ``__code__`` for a function, and the functions its statements moved to."""

    code: types.CodeType
    extracted: dict[str, Callable[..., Any]]  # name -> function, with the original's globals
    statements: list[ExtractedStatement]


def rewrite_function(function: types.FunctionType, lines: list[int]) -> RewrittenFunction:
    """Extract the smallest statement at each of ``lines`` (file line numbers) of ``function``.

    Raises :class:`RewriteRefused` with the reason when the source cannot be read or a
    statement cannot leave its function unchanged in meaning (it returns from a compound
    statement, yields, breaks out of a loop around it, or declares ``global``/``nonlocal``).
    """
    definition = _parse_definition(function)
    code = function.__code__
    statements: list[ExtractedStatement] = []
    extracted_defs: list[ast.FunctionDef] = []
    call_sites: set[int] = set()
    for line in sorted(set(lines)):
        found = _innermost_statement(definition.body, line)
        if found is None:
            raise RewriteRefused(f"no statement of {code.co_qualname} spans line {line}.")
        statement, container, loops = found
        if id(statement) in call_sites:
            continue  # moved already, with the statement of an earlier line
        if any(id(node) in call_sites for node in ast.walk(statement)):
            raise RewriteRefused(
                f"the statement at line {statement.lineno} holds a statement moved already; "
                "one extracted function cannot call another."
            )
        name = f"{EXTRACTED_PREFIX}{code.co_name}_L{statement.lineno}"
        new_def, replacement, extracted = _extract(definition, statement, loops, name, code)
        position = next(i for i, s in enumerate(container) if s is statement)
        container[position : position + 1] = replacement
        call_sites.update(id(node) for node in replacement)
        extracted_defs.append(new_def)
        statements.append(extracted)
    rewritten = _compile_code(definition, function)
    functions = {d.name: _compile_function(d, function) for d in extracted_defs}
    for statement in statements:
        positions = {name: i for i, name in enumerate(statement.parameters)}
        setattr(
            functions[statement.name],
            SHAPE_ONLY,
            frozenset(positions[name] for name in statement.shape_only),
        )
    return RewrittenFunction(rewritten, functions, statements)


def _parse_definition(function: types.FunctionType) -> ast.FunctionDef:
    """The function's ``def`` as an AST with the file's line numbers, decorators removed."""
    try:
        source_lines, start = inspect.getsourcelines(function)
    except (OSError, TypeError) as err:
        raise RewriteRefused(
            f"the source of {function.__qualname__} cannot be read: {err}"
        ) from err
    source = "".join(source_lines)
    try:
        tree = ast.parse(textwrap.dedent(source))
        node = tree.body[0]
    except SyntaxError:
        # a docstring line at column 0 stops dedent; parse as the body of a class instead
        try:
            tree = ast.parse("class _:\n" + source)
        except SyntaxError as err:
            raise RewriteRefused(
                f"the source of {function.__qualname__} does not parse on its own: {err}"
            ) from err
        node = tree.body[0].body[0]  # type: ignore[attr-defined]
        start -= 1
    if not isinstance(node, ast.FunctionDef):
        raise RewriteRefused(f"{function.__qualname__} is not a plain `def` (async or lambda).")
    ast.increment_lineno(node, start - 1)
    node.decorator_list = []
    # defaults and annotations stay on the function object; evaluating them again is not needed
    for argument in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
        argument.annotation = None
    for argument in (node.args.vararg, node.args.kwarg):
        if argument is not None:
            argument.annotation = None
    node.args.defaults = []
    node.args.kw_defaults = [None] * len(node.args.kwonlyargs)
    node.returns = None
    return node


def _innermost_statement(
    body: list[ast.stmt], line: int
) -> tuple[ast.stmt, list[ast.stmt], list[ast.stmt]] | None:
    """The innermost statement spanning ``line``, the list holding it, and the loops around it.

    A line in a compound statement's header (an ``if``'s test, a loop's header, a ``with``'s
    items) selects the whole compound statement: its question decides which of its body runs.
    """
    for statement in body:
        if not statement.lineno <= line <= (statement.end_lineno or statement.lineno):
            continue
        for child_body in _bodies(statement):
            if line == statement.lineno or line < child_body[0].lineno:
                break
            for child in child_body:
                if child.lineno <= line <= (child.end_lineno or child.lineno):
                    found = _innermost_statement(child_body, line)
                    if found is None:
                        return None
                    inner, container, loops = found
                    if isinstance(statement, (ast.For, ast.While)):
                        loops = [statement, *loops]
                    return inner, container, loops
        return statement, body, []
    return None


def _bodies(statement: ast.stmt) -> list[list[ast.stmt]]:
    bodies = [
        value
        for field_name in ("body", "orelse", "finalbody")
        if isinstance(value := getattr(statement, field_name, None), list) and value
    ]
    bodies += [handler.body for handler in getattr(statement, "handlers", [])]
    return bodies


def _check_extractable(statement: ast.stmt) -> None:
    """Refuse statements whose control flow reaches outside them."""

    def walk(node: ast.AST, in_loop: bool) -> Iterator[tuple[ast.AST, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            loop = in_loop or isinstance(child, (ast.For, ast.While))
            yield child, in_loop
            yield from walk(child, loop)

    is_loop = isinstance(statement, (ast.For, ast.While))
    for node, in_loop in walk(statement, is_loop):
        if isinstance(node, ast.Return):
            raise RewriteRefused(
                f"the statement at line {statement.lineno} returns from its function, so what "
                "runs after it depends on its outcome, which one graph call cannot express."
            )
        if isinstance(node, (ast.Break, ast.Continue)) and not in_loop:
            raise RewriteRefused(
                f"the statement at line {statement.lineno} leaves a loop around it "
                "(break/continue)."
            )
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            raise RewriteRefused(f"the statement at line {statement.lineno} yields or awaits.")
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            raise RewriteRefused(
                f"the statement at line {statement.lineno} declares global or nonlocal names."
            )
    if isinstance(statement, (ast.Global, ast.Nonlocal)):
        raise RewriteRefused(f"line {statement.lineno} declares global or nonlocal names.")


def _position(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.col_offset)  # type: ignore[attr-defined]


def _arguments(code: types.CodeType) -> tuple[str, ...]:
    count = (
        code.co_argcount
        + code.co_kwonlyargcount
        + bool(code.co_flags & inspect.CO_VARARGS)
        + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    )
    return code.co_varnames[:count]


def _extract(
    definition: ast.FunctionDef,
    statement: ast.stmt,
    loops: list[ast.stmt],
    name: str,
    code: types.CodeType,
) -> tuple[ast.FunctionDef, list[ast.stmt], ExtractedStatement]:
    """The new function for ``statement`` and the statements that call it in its place.

    Parameters: the locals bound before the statement (by position, or anywhere in a loop
    around it, which runs again) that it reads before binding them, or returns without binding
    them on every path. Results: the locals it binds or mutates that are read after it (or
    anywhere in a loop around it). A bare ``return <expr>`` is moved whole and its call
    returned.
    """
    returns_value = isinstance(statement, ast.Return)
    if not returns_value:
        _check_extractable(statement)
    local_names = set(code.co_varnames) | set(code.co_cellvars)
    arguments = _arguments(code)
    inside = {id(node) for node in ast.walk(statement)}
    in_loops = {id(node) for loop in loops for node in ast.walk(loop)}
    start, end = _position(statement), (statement.end_lineno or statement.lineno, 1 << 30)
    bound_before, read_after = set(arguments), set()
    for node in ast.walk(definition):
        if id(node) in inside or not isinstance(node, ast.Name):
            continue
        if isinstance(node.ctx, ast.Store) and (_position(node) < start or id(node) in in_loops):
            bound_before.add(node.id)
        if isinstance(node.ctx, ast.Load) and (_position(node) > end or id(node) in in_loops):
            read_after.add(node.id)
    used = statement_names([statement])
    receiver = arguments[0] if arguments and "." in code.co_qualname else None
    if receiver and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "super"
        for n in ast.walk(statement)
    ):
        used.reads.insert(0, receiver)  # zero-argument super() reads the first argument
    results = tuple(
        n
        for n in used.binds
        if n in local_names and n in read_after and n != receiver and not returns_value
    )
    # what the statement reads before binding it, and what it returns without binding it on
    # every path, comes in; a name it binds before any read (an earlier branch's temporary,
    # unbound when that branch did not run) does not
    reads_first, always_bound = reads_before_binding([statement])
    needed = reads_first | {receiver} | (set(results) - always_bound)
    parameters = tuple(
        dict.fromkeys(
            n
            for n in [*used.reads, *used.binds]
            if n in local_names and n in bound_before and n in needed
        )
    )
    if receiver in parameters:  # first, where super() and readers expect it
        parameters = (receiver, *(p for p in parameters if p != receiver))
    body: list[ast.stmt] = [statement]
    if results:
        body.append(ast.Return(_load_tuple(results)))
    new_def = ast.FunctionDef(
        name=name,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(p) for p in parameters],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    call = ast.Call(ast.Name(name, ast.Load()), [ast.Name(p, ast.Load()) for p in parameters], [])
    replacement: list[ast.stmt]
    if returns_value:
        replacement = [ast.Return(call)]
    elif not results:
        replacement = [ast.Expr(call)]
    elif len(results) == 1:
        replacement = [ast.Assign([ast.Name(results[0], ast.Store())], call)]
    else:
        # indexing, not unpacking: a traced result of unknown length can be indexed, not iterated
        replacement = [ast.Assign([ast.Name(_RESULTS, ast.Store())], call)] + [
            ast.Assign(
                [ast.Name(n, ast.Store())],
                ast.Subscript(ast.Name(_RESULTS, ast.Load()), ast.Constant(i), ast.Load()),
            )
            for i, n in enumerate(results)
        ]
    # new nodes take the statement's lines, so frames and recorded nodes point at the model file
    for node in [new_def, *replacement]:
        for child in ast.walk(node):
            if id(child) not in inside and isinstance(child, (ast.stmt, ast.expr, ast.arg)):
                child.lineno, child.col_offset = statement.lineno, statement.col_offset
                child.end_lineno = statement.end_lineno
                child.end_col_offset = statement.end_col_offset
    ast.fix_missing_locations(new_def)
    before = textwrap.dedent(
        "".join(
            linecache.getline(code.co_filename, n)
            for n in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
        )
    ).rstrip()
    after = ast.unparse(new_def) + "\n\n" + "\n".join(ast.unparse(r) for r in replacement)
    extracted = ExtractedStatement(
        name,
        statement.lineno,
        parameters,
        results,
        receiver in parameters,
        before,
        after,
        shape_only_names(statement, parameters),
    )
    return new_def, replacement, extracted


def _load_tuple(names: tuple[str, ...]) -> ast.expr:
    if len(names) == 1:
        return ast.Name(names[0], ast.Load())
    return ast.Tuple([ast.Name(n, ast.Load()) for n in names], ast.Load())


def _scoped_module(definition: ast.FunctionDef, freevars: tuple[str, ...]) -> ast.Module:
    """``def _llmc_scope(): <freevars> = None; <definition>; return <name>``.

    Compiled inside a scope that binds the original's free variables (``__class__`` for
    ``super()``), the definition's code gets the same free variables as the original, which
    is what assigning ``__code__`` (and building a function on the original's cells) needs.
    """
    scope_body: list[ast.stmt] = [
        ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in freevars
    ]
    scope_body += [definition, ast.Return(ast.Name(definition.name, ast.Load()))]
    scope = ast.FunctionDef(
        name="_llmc_scope",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=scope_body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    module = ast.Module([scope], type_ignores=[])
    for node in ast.walk(module):
        if isinstance(node, (ast.stmt, ast.expr)) and not hasattr(node, "lineno"):
            ast.copy_location(node, definition)
    return ast.fix_missing_locations(module)


def _compiled_code(definition: ast.FunctionDef, function: types.FunctionType) -> types.CodeType:
    freevars = function.__code__.co_freevars
    namespace: dict[str, Any] = {}
    exec(
        compile(_scoped_module(definition, freevars), function.__code__.co_filename, "exec"),
        namespace,
    )
    return namespace["_llmc_scope"]().__code__


def _compile_code(definition: ast.FunctionDef, function: types.FunctionType) -> types.CodeType:
    """The rewritten definition's code, with the original's name and free variables."""
    original = function.__code__
    code = _compiled_code(definition, function)
    if code.co_freevars != original.co_freevars:
        # a free variable read only by a moved statement: keep a (never run) read of it
        keep = ast.If(
            ast.Constant(False),
            [
                ast.Expr(
                    ast.Tuple([ast.Name(v, ast.Load()) for v in original.co_freevars], ast.Load())
                )
            ],
            [],
        )
        definition.body.insert(0, ast.copy_location(keep, definition.body[0]))
        ast.fix_missing_locations(definition)
        code = _compiled_code(definition, function)
    if code.co_freevars != original.co_freevars:
        raise RewriteRefused(
            f"the rewritten {original.co_qualname} needs free variables "
            f"{code.co_freevars} where the original has {original.co_freevars}."
        )
    return code.replace(co_name=original.co_name, co_qualname=original.co_qualname)


def _compile_function(
    definition: ast.FunctionDef, function: types.FunctionType
) -> Callable[..., Any]:
    """An extracted function with the original's globals and the cells it reads."""
    code = _compiled_code(definition, function)
    cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
    closure = tuple(cells[name] for name in code.co_freevars)
    extracted = types.FunctionType(
        code.replace(co_qualname=definition.name),
        function.__globals__,
        definition.name,
        None,
        closure or None,
    )
    extracted.__module__ = function.__module__
    return extracted
