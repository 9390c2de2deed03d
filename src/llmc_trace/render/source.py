"""The source view: each function a trace ran through, as source, with its decisions and nodes.

Lines are coloured by the status of the decision taken there (see
:mod:`~llmc_trace.tracing.decisions`), the branches the trace never took are greyed, and each
line lists the graph nodes it recorded, linked to the node list (name, operation, subgraph),
whose entries link back to their line. The links are plain anchors, so the page needs no
script: a node's ``#node-<name>`` and a line's ``#L-<function>-<line>``
(``#L-Qwen2VLModel.forward-1160``) address them from anywhere. A trace that stopped marks the line it stopped at.
"""

from __future__ import annotations

import ast
import functools
import html
import linecache
from dataclasses import dataclass, field
from importlib import resources

from torch import fx

from llmc_trace.core.markup import page_start, safe_id
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.decisions import STATUSES, Decision
from llmc_trace.tracing.source import SourceLocation, display_path


@dataclass
class _Function:
    """One function of model code as the page shows it."""

    abs_file: str
    qualname: str
    start: int
    end: int
    decisions: dict[int, list[Decision]] = field(default_factory=dict)
    nodes: dict[int, list[str]] = field(default_factory=dict)


def source_page(trace: TracedModel) -> str:
    """The self-contained page of ``trace``'s source view (decisions as recorded: a trace made
    without ``record_decisions`` shows its nodes only)."""
    graph = _graph_of(trace)
    subgraph_of = {
        node.name: index
        for index, subgraph in enumerate(trace.subgraphs)
        for node in subgraph.graph.nodes
        if node.op not in ("placeholder", "output")
    }
    functions: dict[tuple[str, str], _Function] = {}

    def function_at(abs_file: str, qualname: str, line: int) -> _Function | None:
        key = (abs_file, qualname)
        if key not in functions:
            span = _function_span(abs_file, qualname, line)
            if span is None:
                return None
            functions[key] = _Function(abs_file, qualname, *span)
        return functions[key]

    for decision in trace.decisions:
        found = function_at(decision.abs_file, decision.function, decision.line)
        if found is not None:
            found.decisions.setdefault(decision.line, []).append(decision)
    located: list[tuple[fx.Node, _Function, int]] = []
    for node in graph.nodes if graph is not None else []:
        where: SourceLocation | None = node.meta.get("source")
        if where is None or node.op in ("placeholder", "output"):
            continue
        found = function_at(where.abs_file, where.function, where.line)
        if found is not None:
            found.nodes.setdefault(where.line, []).append(node.name)
            located.append((node, found, where.line))
    ordered = sorted(functions.values(), key=lambda f: (display_path(f.abs_file), f.start))
    ids = {id(function): index for index, function in enumerate(ordered)}
    stopped = trace.failure.location if trace.failure is not None else None
    body = [
        _legend(),
        '</header>\n<main class="source-view">\n<div id="code">',
        _function_index(ordered, ids),
        *(_function_html(f, ids[id(f)], subgraph_of, stopped) for f in ordered),
        "</div>",
        _node_list(located, subgraph_of),
        "</main>\n</body>\n</html>\n",
    ]
    return page_start(f"{trace.name}: source", _css()) + "\n".join(body)


def line_id(function: str, line: int) -> str:
    """A line's anchor, stable from run to run: ``L-Qwen2VLModel.forward-1160``."""
    return safe_id("L-", f"{function}-{line}")


def node_id(name: str) -> str:
    return safe_id("node-", name)


def _graph_of(trace: TracedModel) -> fx.Graph | None:
    if trace.trace is not None:
        return trace.trace.graph
    return trace.partial_graph


@functools.lru_cache(maxsize=64)
def _spans(abs_file: str) -> dict[str, list[tuple[int, int]]]:
    """Qualified name -> (first line with decorators, last line) of every function of a file."""
    try:
        tree = ast.parse("".join(linecache.getlines(abs_file)))
    except (SyntaxError, ValueError):
        return {}
    spans: dict[str, list[tuple[int, int]]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans.setdefault(name, []).append((start, child.end_lineno or child.lineno))
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def _function_span(abs_file: str, qualname: str, line: int) -> tuple[int, int] | None:
    for start, end in _spans(abs_file).get(qualname, []):
        if start <= line <= end:
            return start, end
    return None


def _css() -> str:
    return resources.files("llmc_trace.render").joinpath("source.css").read_text(encoding="utf-8")


def _legend() -> str:
    spans = "".join(f'<span class="st-{s}">{s}</span>' for s in STATUSES)
    return f'<div class="legend">{spans}<span class="untaken-key">greyed: a branch the trace never took</span></div>'


def _function_index(ordered: list[_Function], ids: dict[int, int]) -> str:
    links = "".join(f'<a href="#f-{ids[id(f)]}">{html.escape(f.qualname)}</a>' for f in ordered)
    return f'<nav id="functions">{links}</nav>'


def _function_html(
    function: _Function,
    index: int,
    subgraph_of: dict[str, int],
    stopped: SourceLocation | None,
) -> str:
    untaken = {
        line
        for decisions in function.decisions.values()
        for decision in decisions
        for first, last in decision.untaken
        for line in range(first, last + 1)
    }
    rows = []
    for line in range(function.start, function.end + 1):
        text = linecache.getline(function.abs_file, line).rstrip("\n")
        decisions = function.decisions.get(line, [])
        classes = [f"st-{decisions[0].status}"] if decisions else []
        if line in untaken:
            classes.append("untaken")
        if stopped is not None and stopped.abs_file == function.abs_file and stopped.line == line:
            classes.append("stopped")
        anchor = line_id(function.qualname, line)
        links = "".join(
            f'<a class="node" href="#{node_id(name)}" title="subgraph '
            f'{subgraph_of.get(name, "-")}">{html.escape(name)}</a>'
            for name in function.nodes.get(line, [])
        )
        notes = "".join(_decision_note(d) for d in decisions)
        if stopped is not None and "stopped" in classes:
            notes += '<span class="decision st-value">tracing stopped here</span>'
        rows.append(
            f'<tr id="{anchor}" class="{" ".join(classes)}"><td class="no">'
            f'<a href="#{anchor}">{line}</a></td><td class="src">{html.escape(text)}</td>'
            f'<td class="links">{links}{notes}</td></tr>'
        )
    where = f"{display_path(function.abs_file)}:{function.start}"
    return (
        f'<section class="function" id="f-{index}"><h2>{html.escape(function.qualname)} '
        f'<span class="where">{html.escape(where)}</span></h2>\n<table class="code">\n'
        + "\n".join(rows)
        + "\n</table></section>"
    )


def _decision_note(decision: Decision) -> str:
    owner = f" (in {decision.owner})" if decision.owner else ""
    text = (
        f"{decision.status} {decision.kind}: {decision.outcome()}; {decision.decided_by}{owner}. "
        f"Flips: {decision.flips}"
    )
    return f'<span class="decision st-{decision.status}">{html.escape(text)}</span>'


def _node_list(located: list[tuple[fx.Node, _Function, int]], subgraph_of: dict[str, int]) -> str:
    rows = []
    for node, function, line in located:
        target = (
            node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        )
        subgraph = subgraph_of.get(node.name)
        rows.append(
            f'<tr id="{node_id(node.name)}"><td><a class="line" href="#{line_id(function.qualname, line)}">'
            f"{html.escape(node.name)}</a></td><td>{html.escape(str(target))}</td>"
            f"<td>{'' if subgraph is None else f'subgraph #{subgraph}'}</td></tr>"
        )
    return (
        '<aside id="nodes"><h2>graph nodes</h2><table>\n' + "\n".join(rows) + "\n</table></aside>"
    )
