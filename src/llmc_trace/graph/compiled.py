"""Compile a subgraph's Python code so that a failure inside it names the model's own line.

``fx.Graph.python_code`` gives each subgraph a ``forward`` of its own, with no file behind it:
a crash in it would be reported at ``<llmc-trace subgraph 3>``, with no line to read and no
word of the model, although every node recorded the model line that made it
(``node.meta["source"]``, :mod:`llmc_trace.tracing.source`). As torch.fx's ``GraphModule``
does, the code is registered with :mod:`linecache` under its name, so a traceback shows the
generated statement; and an exception whose traceback ends in that code (or in torch below
it, where no model frame says where it came from) gets a note naming the node and the
model's file, line and statement that made it.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import os
import re
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from llmc_trace.tracing.source import SourceLocation

_TORCH_ROOT = os.path.dirname(torch.__file__) + os.sep
#: One number per compiled code: subgraphs of the model and of its twin share their indices.
_COMPILED = itertools.count()
#: The attribute of a located exception that holds :func:`failing_operation`'s answer.
_MADE_BY = "llmc_trace_made_by"
#: ``    name = ...``: the statement of the generated code that computes the node ``name``.
_ASSIGNMENT = re.compile(r"^\s+(\w+) = ")
#: fx writes a read of the root module itself (a ``get_attr`` of its path, ``""``: the model
#: handed to a recorded method of its own, as Qwen2.5-Omni's thinker hands itself to
#: ``get_audio_features`` on transformers 5.17) as ``getattr(self, "")``, which no module
#: answers; in a subgraph's ``forward`` the root is ``self``.
_ROOT_READ = re.compile(r'= getattr\(self, ""\)$', re.MULTILINE)


def compile_forward(graph: fx.Graph, label: str) -> Callable[..., Any]:
    """``graph``'s ``forward(self, **inputs)``, its source registered under a name made from
    ``label`` (see the module docstring); it behaves as the bare generated function except
    for the note on a failure."""
    code = graph.python_code(root_module="self")
    src = _ROOT_READ.sub("= self", code.src)
    filename = f"<llmc-trace {label} #{next(_COMPILED)}>"
    lines = src.splitlines(keepends=True)
    # no modification time: linecache.checkcache keeps the entry, as for a loader's source
    linecache.cache[filename] = (len(src), None, lines, filename)
    namespace = dict(code.globals)
    exec(compile(src, filename, "exec"), namespace)
    forward = namespace["forward"]
    sources = _sources_by_line(graph, lines)

    @functools.wraps(forward)
    def located(*args: Any, **kwargs: Any) -> Any:
        try:
            return forward(*args, **kwargs)
        except Exception as err:
            line = _unlocated_line(err.__traceback__, filename)
            if line is not None and line in sources:
                err.add_note(_note(label, *sources[line][:2]))
                setattr(err, _MADE_BY, sources[line][1:])
            raise

    return located


def failing_operation(err: BaseException) -> tuple[SourceLocation, str, str] | None:
    """Where the model made the operation of a subgraph that raised ``err``: its line, and the
    path and class of the module it ran in; ``None`` when the failure was not located."""
    return getattr(err, _MADE_BY, None)


def _sources_by_line(
    graph: fx.Graph, lines: list[str]
) -> dict[int, tuple[str, SourceLocation, str, str]]:
    """For each line (from 1) of the generated code that computes a node with a recorded model
    location: the node's name, that location, and the path and class of its module."""
    located = {
        node.name: (
            node.meta["source"],
            node.meta.get("module_path", ""),
            node.meta.get("module_class", ""),
        )
        for node in graph.nodes
        if isinstance(node.meta.get("source"), SourceLocation)
    }
    found = {}
    for number, text in enumerate(lines, start=1):
        match = _ASSIGNMENT.match(text)
        if match is not None and match.group(1) in located:
            found[number] = (match.group(1), *located[match.group(1)])
    return found


def _unlocated_line(tb: types.TracebackType | None, filename: str) -> int | None:
    """The line of ``filename`` where the failure happened, when no frame below it is model
    code (every deeper frame is torch's); ``None`` when a deeper frame already names a line."""
    line = None
    while tb is not None:
        frame_file = tb.tb_frame.f_code.co_filename
        if frame_file == filename:
            line = tb.tb_lineno
        elif line is not None and not frame_file.startswith(_TORCH_ROOT):
            return None
        tb = tb.tb_next
    return line


def _note(label: str, node: str, source: SourceLocation) -> str:
    """Where the model made the failing node, in the shape of a traceback entry."""
    return (
        f"The failing operation of {label} is node {node}, from the model's code:\n"
        f'  File "{source.abs_file}", line {source.line}, in {source.function}\n'
        f"    {source.code}"
    )
