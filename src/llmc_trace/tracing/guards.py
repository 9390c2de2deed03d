"""Guards: the concrete decisions a trace took from its sample, checked against later batches.

A traced graph is only valid for inputs that would have made the same decisions (the same
branch on a sequence length, the same number of images). Each decision is a :class:`Guard`
naming the graph node whose value was asked about and the answer. :func:`check_guards`
re-evaluates those nodes on another batch's *shapes* (on ``meta``, so it is cheap) and lists the
guards it violates; the trace cache then re-traces for that input signature instead of running
the wrong graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from llmc_trace.tracing.source import SourceLocation
from llmc_trace.tracing.values import compute_value, runner_for


@dataclass(frozen=True)
class Guard:
    """One decision: ``question(node) == expected`` (question is bool, len, int, index, ...)."""

    node: str
    question: str
    expected: Any
    location: SourceLocation | None
    argument: Any = None  # the item of an ``in`` question

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"{self.question}({self.node}) == {self.expected!r}{where}"


@dataclass(frozen=True)
class GuardViolation:
    guard: Guard
    actual: Any


def input_signature(inputs: dict[str, Any]) -> tuple[Any, ...]:
    """Shapes and dtypes of the tensor inputs, values of the rest: the trace cache key."""
    items = []
    for name in sorted(inputs):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            items.append((name, tuple(value.shape), str(value.dtype)))
        else:
            items.append((name, repr(value)))
    return tuple(items)


def check_guards(
    graph: fx.Graph, root: torch.nn.Module, guards: list[Guard], inputs: dict[str, Any]
) -> list[GuardViolation]:
    """Evaluate every guarded node on ``inputs`` (as ``meta``) and return the violated guards.

    Only the guarded nodes and their ancestors run, so checking a batch costs a few shape
    computations, not a forward pass.
    """
    if not guards:
        return []
    by_name = {node.name: node for node in graph.nodes}
    needed: set[str] = set()
    stack = [g.node for g in guards]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(n.name for n in by_name[name].all_input_nodes)
    env: dict[str, Any] = {}
    for node in graph.nodes:
        if node.name not in needed:
            continue
        env[node.name] = _evaluate(node, root, env, inputs)
    violations = []
    for guard in guards:
        extra = (guard.argument,) if guard.question == "contains" else ()
        actual = _plain(ask(guard.question, env[guard.node], *extra))
        if actual != guard.expected:
            violations.append(GuardViolation(guard, actual))
    return violations


def _evaluate(
    node: fx.Node, root: torch.nn.Module, env: dict[str, Any], inputs: dict[str, Any]
) -> Any:
    if node.op == "placeholder":
        value = inputs[node.target]
        # shape questions only need meta; value questions on real integer inputs stay real
        return value
    if node.op == "get_attr":
        value: Any = root
        for atom in node.target.split("."):
            value = getattr(value, atom)
        return value
    args = fx.node.map_arg(node.args, lambda n: env[n.name])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n.name])
    module = root.get_submodule(node.target) if node.op == "call_module" else None
    run = runner_for(node.op, node.target, module)
    computed = compute_value(run, args, kwargs, module=module, allow_phantoms=True)
    if computed.value is None and computed.error is not None:
        raise computed.error
    return computed.value


def ask(question: str, value: Any, *extra: Any) -> Any:
    """Answer one question (``bool``, ``len``, ``iter`` (a length), ``int``, ``index``, ``float``, ``contains``)."""
    if question == "bool":
        return bool(value)
    if question in ("len", "iter"):
        return len(value)
    if question in ("int", "index"):
        return int(value)
    if question == "float":
        return float(value)
    if question == "contains":
        return extra[0] in value
    raise AssertionError(f"unknown question {question}")


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, torch.Tensor) else value
