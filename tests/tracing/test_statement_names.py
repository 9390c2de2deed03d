"""What a moved statement needs from outside: the names it reads before it binds them."""

from __future__ import annotations

import ast
import textwrap

import pytest

from llmc_trace.tracing.statement_names import reads_before_binding, shape_only_names


def flow(source: str) -> tuple[set[str], frozenset[str]]:
    return reads_before_binding(ast.parse(textwrap.dedent(source)).body)


@pytest.mark.parametrize(
    ("source", "reads", "bound"),
    [
        # a temporary bound before its read on the only path that reads it
        ("if x:\n    t = f(x)\n    y = g(t)\n", {"x", "f", "g"}, set()),
        # bound on one path only: read before binding on the other
        ("if x:\n    y = 1\nz = y\n", {"x"} | {"y"}, {"z"}),
        # bound on every path: sure to go out
        ("if x:\n    y = 1\nelse:\n    y = 2\n", {"x"}, {"y"}),
        # an in-place change reads what it changes
        ("x += 1\n", {"x"}, {"x"}),
        ("h[0] = v\n", {"h", "v"}, {"h"}),
        # a loop may not run; its target is bound inside it
        ("for i in xs:\n    s = i\nr = s\n", {"xs", "s"}, {"r"}),
        # read in one pass before the pass binds it: read before binding in the first pass
        ("while c:\n    n = m\n    m = 1\n", {"c", "m"}, set()),
        # a handler runs after any line of the body
        ("try:\n    a = f()\nexcept E as e:\n    b = a\n", {"f", "E", "a"}, set()),
        ("with open(p) as fh:\n    d = fh.read()\n", {"open", "p"}, {"fh", "d"}),
    ],
)
def test_reads_before_binding(source: str, reads: set[str], bound: set[str]) -> None:
    got_reads, got_bound = flow(source)
    assert got_reads == reads
    assert set(got_bound) == bound


@pytest.mark.parametrize(
    ("source", "shape_only"),
    [
        # SpeechT5's checks: the value is passed in, its data never read
        ("if out.size() != (b, n):\n    raise ValueError(f'{out.size()}')\n", ("out", "b", "n")),
        ("if x.shape[1] > len(y) and x.dtype == t:\n    pass\n", ("x", "y")),
        # a read of the data, or the name handed on whole, is no shape read
        ("if x.size(0) > 1:\n    y = x * 2\n", ()),
        ("check(x)\n", ()),
        ("n = x.dim()\n", ("x",)),
    ],
)
def test_names_read_only_for_their_shape(source: str, shape_only: tuple[str, ...]) -> None:
    statement = ast.parse(source).body[0]
    names = ("out", "x", "y")
    got = shape_only_names(statement, names)
    assert got == tuple(n for n in names if n in shape_only)
