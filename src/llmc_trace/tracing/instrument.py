"""Compile model files with every condition and loop routed through the decision recorder.

Watching a trace with :func:`sys.settrace` slows Python 3.11's whole interpreter (every frame,
torch's and fx's included, takes the tracing path): a trace took 2.6x as long. Instead, each
model file is compiled once more from its own source, with each ``if``/``elif``/``while``
condition, ternary test and ``assert`` wrapped as ``__llmc_decision__.decide(site, mark, test)``
and each loop's iterable as ``__llmc_decision__.loop(site, mark, iterable)``; ``mark`` counts
the guards asked so far, so the recorder knows which the condition asked. Compiled under the
file's own name, its line numbers are the file's. While a trace runs, :func:`instrumented`
swaps each function's ``__code__`` for its instrumented twin (as autowrap swaps one function,
see :mod:`~llmc_trace.tracing.autowrap`) and puts the recorder in the module's globals.
Afterwards the functions get their code back and the recorder gives way to
:data:`PASS_THROUGH`: a closure the model made while traced (a mask function the graph keeps)
carries instrumented code, and must still run, as it would have, after the trace.

Compiling costs tens of milliseconds a file, more than a small model's whole trace, so the
compiled code is kept on disk (``$XDG_CACHE_HOME/llmc-trace/decisions``, like ``__pycache__``),
keyed by the file's path, size and modification time and the Python version.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import linecache
import marshal
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from llmc_trace.tracing.branches import Branching, branching_of

HOOK = "__llmc_decision__"


class _PassThrough:
    """The hook outside a trace: each condition and loop behaves exactly as uninstrumented."""

    @staticmethod
    def mark() -> int:
        return 0

    @staticmethod
    def decide(site: int, mark: int, value: Any) -> bool:
        return bool(value)

    @staticmethod
    def loop(site: int, mark: int, iterable: Any) -> Any:
        return iter(iterable)


PASS_THROUGH = _PassThrough()
#: Changes whenever the rewrite does: cached files of another version are never read.
_FORMAT = 2


@dataclass(frozen=True)
class InstrumentedFile:
    """A model file compiled with its decisions routed to the recorder.

    ``sites[i]`` is the construct whose hook call passes ``i``; ``functions`` maps each
    function's ``(qualified name, first line)`` to its instrumented code.
    """

    filename: str
    sites: tuple[Branching, ...]
    functions: dict[tuple[str, int], types.CodeType]


class _Rewriter(ast.NodeTransformer):
    """Wraps each construct's condition in a hook call, numbering the constructs."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.sites: list[Branching] = []

    def _reserve(self, node: ast.AST) -> int:
        branching = branching_of(node, self.lines)
        assert branching is not None
        self.sites.append(branching)
        return len(self.sites) - 1

    def _hook(self, method: str, site: int, value: ast.expr) -> ast.expr:
        """``__llmc_decision__.<method>(site, __llmc_decision__.mark(), value)``, located at
        ``value`` (tracebacks and guards then point at the condition's line)."""

        def at(node: ast.expr) -> ast.expr:
            return ast.copy_location(node, value)

        def hook_attribute(name: str) -> ast.expr:
            return at(ast.Attribute(at(ast.Name(HOOK, ast.Load())), name, ast.Load()))

        mark = at(ast.Call(hook_attribute("mark"), [], []))
        return at(ast.Call(hook_attribute(method), [at(ast.Constant(site)), mark, value], []))

    def _wrap_test(self, node: ast.If | ast.While | ast.IfExp | ast.Assert) -> ast.AST:
        site = self._reserve(node)
        self.generic_visit(node)
        node.test = self._hook("decide", site, node.test)
        return node

    visit_If = visit_While = visit_IfExp = visit_Assert = _wrap_test  # noqa: N815

    def visit_For(self, node: ast.For) -> ast.AST:  # noqa: N802
        site = self._reserve(node)
        self.generic_visit(node)
        node.iter = self._hook("loop", site, node.iter)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        site = self._reserve(node)
        self.generic_visit(node)
        node.iter = self._hook("loop", site, node.iter)
        return node


def instrument_source(filename: str) -> tuple[types.CodeType, tuple[Branching, ...]] | None:
    """``filename``'s module code with every construct's hook call, and the constructs."""
    lines = linecache.getlines(filename)
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        return None
    rewriter = _Rewriter(lines)
    tree = ast.fix_missing_locations(rewriter.visit(tree))
    return compile(tree, filename, "exec", dont_inherit=True), tuple(rewriter.sites)


@functools.lru_cache(maxsize=256)
def _instrumented(filename: str, size: int, mtime_ns: int) -> InstrumentedFile | None:
    cache = _cache_path(filename, size, mtime_ns)
    loaded = _read_cache(cache)
    if loaded is None:
        made = instrument_source(filename)
        if made is None:
            return None
        loaded = made
        _write_cache(cache, loaded)
    code, sites = loaded
    return InstrumentedFile(filename, sites, _functions_in(code))


def instrumented_file(filename: str) -> InstrumentedFile | None:
    """The instrumented compile of ``filename`` (``None`` when its source cannot be read)."""
    try:
        stat = os.stat(filename)
    except OSError:
        return None
    return _instrumented(filename, stat.st_size, stat.st_mtime_ns)


def _functions_in(code: types.CodeType) -> dict[tuple[str, int], types.CodeType]:
    found: dict[tuple[str, int], types.CodeType] = {}
    stack = [code]
    while stack:
        current = stack.pop()
        found.setdefault((current.co_qualname, current.co_firstlineno), current)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return found


def _cache_path(filename: str, size: int, mtime_ns: int) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = f"{_FORMAT}|{sys.version}|{filename}|{size}|{mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return root / "llmc-trace" / "decisions" / f"{Path(filename).stem}-{digest}.bin"


def _read_cache(path: Path) -> tuple[types.CodeType, tuple[Branching, ...]] | None:
    try:
        code, sites = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return code, tuple(Branching(*site) for site in sites)


def _write_cache(path: Path, made: tuple[types.CodeType, tuple[Branching, ...]]) -> None:
    """Written beside its place and renamed; a cache that cannot be written is no error."""
    code, sites = made
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as staging:
            staging.write(marshal.dumps((code, tuple(astuple(site) for site in sites))))
        os.replace(staging.name, path)
    except OSError:
        return


def functions_of(module: types.ModuleType) -> Iterator[types.FunctionType]:
    """The functions defined in ``module``: its own, and its classes' methods, static and
    class methods and property getters, each reached through its decorators."""
    filename = getattr(module, "__file__", None)
    seen: set[int] = set()
    for value in list(vars(module).values()):
        owned = isinstance(value, type) and value.__module__ == module.__name__
        for candidate in list(vars(value).values()) if owned else [value]:
            if isinstance(candidate, (staticmethod, classmethod)):
                candidate = candidate.__func__
            elif isinstance(candidate, property):
                candidate = candidate.fget
            try:
                candidate = inspect.unwrap(candidate)
            except ValueError:
                continue
            if (
                isinstance(candidate, types.FunctionType)
                and candidate.__code__.co_filename == filename
                and id(candidate) not in seen
            ):
                seen.add(id(candidate))
                yield candidate


@contextlib.contextmanager
def instrumented(
    modules: list[types.ModuleType], hook: Any
) -> Iterator[dict[str, InstrumentedFile]]:
    """Run ``modules``' functions as their instrumented twins, reporting to ``hook``; yields
    the instrumented files by file name."""
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []
    injected: list[types.ModuleType] = []
    files: dict[str, InstrumentedFile] = {}
    try:
        for module in modules:
            made = instrumented_file(module.__file__)  # type: ignore[arg-type]
            if made is None:
                continue
            files[made.filename] = made
            module.__dict__[HOOK] = hook
            injected.append(module)
            for function in functions_of(module):
                original = function.__code__
                twin = made.functions.get((original.co_qualname, original.co_firstlineno))
                if twin is not None and twin.co_freevars == original.co_freevars:
                    swapped.append((function, original))
                    function.__code__ = twin
        yield files
    finally:
        for function, original in reversed(swapped):
            function.__code__ = original
        for module in injected:
            module.__dict__[HOOK] = PASS_THROUGH
