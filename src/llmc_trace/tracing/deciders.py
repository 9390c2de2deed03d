"""Judge what decided a branch of model code: a config attribute, the sample, tensor data or a constant.

The condition's names are read from the frame the moment it is decided (without running any
property, ``__getattr__`` or traced code: the tracer would record a read of a parameter), each
becoming a :class:`Fact`: a config attribute (``config.sliding_window``), an input of the sample
(given or not), another traced value, a tensor's data, ``self.training``, an argument the trace
fixes, or a plain constant. A local variable counts by the expression last assigned to it in
its function, so ``mask_function = ... if self.config.sliding_window is None else ...`` names
the config attribute where the mask function is later tested. :func:`judge` weighs the facts
with the guards the condition asked of proxies and the question that stopped the trace.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import linecache
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from transformers import PretrainedConfig

from llmc_trace.tracing.guards import Guard
from llmc_trace.tracing.proxy import DataDependentQuestion

_MISSING = object()
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device)
#: Statuses, sample-dependent ones first: the order decisions are listed in.
STATUSES = ("value", "shape", "config", "constant", "unknown")
#: How deep a local variable's assignments are followed back.
_DEPTH = 3


@dataclass(frozen=True)
class Fact:
    """One name of a condition and what it was when the branch was decided.

    ``kind``: ``config``, ``input`` (a graph input of the sample), ``absent`` (an input of the
    model the sample does not give), ``traced`` (another traced value), ``tensor`` (tensor
    data, inside an opaque call's example), ``training``, ``fixed`` (an argument the trace
    fixes), ``constant`` or ``unknown``.
    """

    kind: str
    name: str
    value: str


@dataclass(frozen=True)
class Evidence:
    """The facts of a condition, read once, the first time the trace decided it."""

    source: str
    facts: tuple[Fact, ...]


@dataclass(frozen=True)
class Verdict:
    status: str
    source: str
    decided_by: str
    flips: str


def gather_evidence(
    condition: ast.expr,
    frame: types.FrameType,
    model_inputs: frozenset[str],
    fixed: dict[str, Any],
) -> Evidence:
    """The facts of ``condition`` in ``frame``; ``model_inputs`` are the names the model's
    ``forward`` accepts and the sample's tensors, ``fixed`` the arguments the trace sets."""
    facts: list[Fact] = []
    for operand in _evaluated_operands(condition, frame):
        _facts_of(operand, frame, model_inputs, fixed, facts, _DEPTH, set())
    unique = tuple(dict.fromkeys(facts))
    return Evidence(_source(condition), unique)


def _evaluated_operands(condition: ast.expr, frame: types.FrameType) -> list[ast.expr]:
    """The operands of an ``and``/``or`` that decided it: up to the first whose truth, read
    from the frame, short-circuits (``use_cache and cache is None`` with ``use_cache`` False
    is decided by ``use_cache`` alone)."""
    if not isinstance(condition, ast.BoolOp):
        return [condition]
    evaluated = []
    for operand in condition.values:
        evaluated.append(operand)
        truth = _known_truth(operand, frame)
        if truth is not None and truth == isinstance(condition.op, ast.Or):
            break
    return evaluated


def _known_truth(node: ast.expr, frame: types.FrameType) -> bool | None:
    """The truth of a name, a ``not``, or an ``is (not) None`` test when the frame holds it
    as a plain value; ``None`` when asking would mean asking a traced value."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _known_truth(node.operand, frame)
        return None if inner is None else not inner
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    ):
        chain = _chain(node.left)
        value = _chain_value(chain, frame) if chain else _MISSING
        if value is _MISSING:
            return None
        return (value is None) == isinstance(node.ops[0], ast.Is)
    chain = _chain(node)
    value = _chain_value(chain, frame) if chain else _MISSING
    return bool(value) if isinstance(value, _PLAIN) else None


def _chain_value(chain: list[str], frame: types.FrameType) -> Any:
    return _resolve(_lookup(frame, chain[0]), chain[1:], _MISSING)


def _source(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 160 else text[:157] + "..."


def _facts_of(
    node: ast.AST,
    frame: types.FrameType,
    model_inputs: frozenset[str],
    fixed: dict[str, Any],
    facts: list[Fact],
    depth: int,
    followed: set[str],
) -> None:
    for chain in _chains(node):
        facts.append(_fact(chain, frame, model_inputs, fixed, facts, depth, followed))


def _chains(node: ast.AST) -> list[list[str]]:
    """The maximal ``a.b.c`` chains of an expression (a call contributes its callee's chain)."""
    found: list[list[str]] = []

    def visit(item: ast.AST) -> None:
        if (
            isinstance(item, ast.Call)
            and isinstance(item.func, ast.Name)
            and item.func.id in ("getattr", "hasattr")
            and len(item.args) >= 2
            and isinstance(item.args[1], ast.Constant)
            and isinstance(item.args[1].value, str)
        ):  # getattr(config, "sliding_window", None) reads config.sliding_window
            inner = _chain(item.args[0])
            if inner is not None:
                found.append([*inner, item.args[1].value])
                return
        chain = _chain(item)
        if chain is not None:
            found.append(chain)
            return
        for child in ast.iter_child_nodes(item):
            visit(child)

    visit(node)
    return found


def _chain(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        inner = _chain(node.value)
        return None if inner is None else [*inner, node.attr]
    return None


def _fact(
    chain: list[str],
    frame: types.FrameType,
    model_inputs: frozenset[str],
    fixed: dict[str, Any],
    facts: list[Fact],
    depth: int,
    followed: set[str],
) -> Fact:
    name = ".".join(chain)
    root = chain[0]
    local = root in frame.f_locals
    value = _lookup(frame, root)
    for index, attribute in enumerate(chain[1:], start=1):
        if isinstance(value, PretrainedConfig):
            config_name = ".".join(["config", *chain[index:]])
            final = _resolve(value, chain[index:])
            return Fact("config", config_name, _short(final))
        if (
            isinstance(value, torch.nn.Module)
            and attribute == "training"
            and index == len(chain) - 1
        ):
            return Fact("training", name, _short(value.training))
        if isinstance(value, fx.Proxy):  # `x.ndim`, `x.dtype`: answered from the example
            given = value.node.op == "placeholder" and index == 1 and root in model_inputs
            return Fact("input" if given else "traced", ".".join(chain[:index]), "traced")
        value = _static_attribute(value, attribute)
        if value is _MISSING:
            return Fact("unknown", name, "?")
    if isinstance(value, PretrainedConfig):
        return Fact("config", "config", type(value).__name__)
    if len(chain) > 1 and callable(value) and not isinstance(value, (torch.nn.Module, type)):
        # `outputs.get(...)`: the method says nothing; the object it is called on does
        return _fact(chain[:-1], frame, model_inputs, fixed, facts, depth, followed)
    if local and len(chain) == 1 and isinstance(value, (dict, list)):
        # outputs gathered under `if pixel_values is not None:`: that `if` filled it
        setting = _setting_lines(frame, root)
        if setting:
            return Fact("branch", name, setting)
    if isinstance(value, fx.Proxy) or (
        isinstance(value, (dict, list, tuple)) and _holds_proxy(value)
    ):
        given = isinstance(value, fx.Proxy) and value.node.op == "placeholder"
        kind = "input" if given and len(chain) == 1 and root in model_inputs else "traced"
        setting = (
            _setting_lines(frame, root) if local and kind == "traced" and len(chain) == 1 else ""
        )
        if setting:  # a traced value set only under an earlier `if`: that `if` says more
            facts.append(Fact(kind, name, "traced"))
            return Fact("branch", name, setting)
        return Fact(kind, name, "traced")
    if isinstance(value, torch.Tensor):
        return Fact("tensor", name, f"tensor{list(value.shape)}")
    if local and len(chain) == 1 and root in fixed:
        return Fact("fixed", name, _short(value))
    if (
        local
        and len(chain) == 1
        and root in model_inputs
        and value is None
        and _is_parameter(frame, root)
    ):
        return Fact("absent", name, "None")
    if local and len(chain) == 1 and depth > 0 and root not in followed:
        assigned = _last_assignment(frame, root)
        if assigned is not None:
            inner: list[Fact] = []
            _facts_of(assigned, frame, model_inputs, fixed, inner, depth - 1, followed | {root})
            decisive = [f for f in inner if f.kind not in ("constant", "unknown")]
            if decisive:
                facts.extend(decisive[:-1])
                return decisive[-1]
    if local and len(chain) == 1:
        # `image_mask = None`, then set only under `if pixel_values is not None:`: that `if`
        # decided what the name holds now
        setting = _setting_lines(frame, root)
        if setting:
            return Fact("branch", name, setting)
    if value is _MISSING:
        return Fact("unknown", name, "?")
    if (
        not local
        or len(chain) > 1
        or isinstance(value, (types.FunctionType, type, types.BuiltinFunctionType))
    ):
        return Fact("constant", name, _short(value))
    if isinstance(value, _PLAIN) and not _is_parameter(frame, root):
        return Fact("unknown", name, _short(value))
    return Fact("constant" if isinstance(value, _PLAIN) else "unknown", name, _short(value))


def _holds_proxy(container: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """A container holding traced values directly (outputs gathered in a dict)."""
    items = container.values() if isinstance(container, dict) else container
    return any(isinstance(item, fx.Proxy) for item in list(items)[:64])


def _lookup(frame: types.FrameType, name: str) -> Any:
    if name in frame.f_locals:
        return frame.f_locals[name]
    if name in frame.f_globals:
        return frame.f_globals[name]
    return getattr(builtins, name, _MISSING)


def _static_attribute(value: Any, attribute: str) -> Any:
    """``value.attribute`` without running a property, ``__getattr__`` or traced code."""
    if isinstance(value, torch.nn.Module):
        for store in ("_parameters", "_buffers", "_modules"):
            held = value.__dict__.get(store, {})
            if attribute in held:
                return held[attribute]
    try:
        found = inspect.getattr_static(value, attribute)
    except AttributeError:
        return _MISSING
    if isinstance(found, (staticmethod, classmethod)):
        return found.__func__
    if isinstance(found, (property, types.MemberDescriptorType, types.GetSetDescriptorType)):
        return _MISSING
    return found


def _resolve(value: Any, chain: list[str], missing: Any = "?") -> Any:
    for attribute in chain:
        if value is _MISSING:
            return missing
        value = _static_attribute(value, attribute)
    return missing if value is _MISSING else value


def _short(value: Any) -> str:
    """A short text of ``value``, never the ``repr`` of a module or a long container (a
    ModuleList of 48 layers of 128 experts prints for half a second)."""
    if isinstance(value, (types.FunctionType, type)):
        return value.__qualname__
    if isinstance(value, torch.nn.Module):
        return type(value).__name__
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 8:
        described = f"{type(value).__name__} of {len(value)}"
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) for v in value):
            counts: dict[Any, int] = {}
            for item in value:
                counts[item] = counts.get(item, 0) + 1
            if len(counts) <= 4:  # config.layer_types: which kinds, how many of each
                described += ": " + ", ".join(f"{k} x{n}" for k, n in counts.items())
        return described
    if not isinstance(value, (*_PLAIN, list, tuple, dict, set, frozenset)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_parameter(frame: types.FrameType, name: str) -> bool:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    return name in code.co_varnames[:count]


def _last_assignment(frame: types.FrameType, name: str) -> ast.expr | None:
    """The expression last assigned to local ``name`` before the current line of ``frame``."""
    line = frame.f_lineno
    earlier = [value for at, value in _assignments(frame.f_code).get(name, ()) if at < line]
    return earlier[-1] if earlier else None


@functools.lru_cache(maxsize=4096)
def _assignments(code: types.CodeType) -> dict[str, list[tuple[int, ast.expr]]]:
    """Each local name of ``code``'s function -> its assignments (file line, value), in order."""
    found = _function_node(code)
    if found is None:
        return {}
    function, offset = found
    assigned: dict[str, list[tuple[int, ast.expr]]] = {}
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value:
            targets = [node.target]
        for target in targets:
            for name in _bound_names(target):
                assigned.setdefault(name, []).append((node.lineno + offset, node.value))  # type: ignore[attr-defined]
    for entries in assigned.values():
        entries.sort(key=lambda entry: entry[0])
    return assigned


def _setting_lines(frame: types.FrameType, name: str) -> str:
    """The ``if`` statements before the current line whose branches set ``name``, each as
    ``line:branch`` (``"537:then,535:then"``), innermost first: an inner ``if`` the trace
    never reached says nothing, nor one that took the other branch."""
    found = {
        (at, branch)
        for at, branch in _branch_assignments(frame.f_code).get(name, ())
        if at < frame.f_lineno
    }
    return ",".join(f"{at}:{branch}" for at, branch in sorted(found, reverse=True))


@functools.lru_cache(maxsize=4096)
def _branch_assignments(code: types.CodeType) -> dict[str, list[tuple[int, str]]]:
    """Each name ``code``'s function assigns (or assigns an item or attribute of) inside the
    branches of an ``if`` -> the file line of each such ``if`` and the branch (``then`` or
    ``else``) that assigns it."""
    found = _function_node(code)
    if found is None:
        return {}
    function, offset = found
    assigned: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(function):
        if not isinstance(node, ast.If):
            continue
        for branch, statements in (("then", node.body), ("else", node.orelse)):
            for statement in statements:
                for inner in ast.walk(statement):
                    targets: list[ast.expr] = []
                    if isinstance(inner, ast.Assign):
                        targets = inner.targets
                    elif isinstance(inner, (ast.AnnAssign, ast.AugAssign)):
                        targets = [inner.target]
                    for target in targets:
                        while isinstance(target, (ast.Subscript, ast.Attribute)):
                            target = target.value
                        for name in _bound_names(target):
                            assigned.setdefault(name, []).append((node.lineno + offset, branch))
    return assigned


def _bound_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for item in target.elts for name in _bound_names(item)]
    return []


@functools.lru_cache(maxsize=4096)
def _function_node(code: types.CodeType) -> tuple[ast.AST, int] | None:
    """The syntax tree of ``code``'s function alone (a whole modeling file takes tens of
    milliseconds to parse), with the line offset of its first line."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return None
    block = inspect.getblock(lines[code.co_firstlineno - 1 :])
    try:
        return ast.parse(textwrap.dedent("".join(block))), code.co_firstlineno - 1
    except SyntaxError:
        return None


# --------------------------------------------------------------------- the verdict
def judge(
    evidence: Evidence,
    guards: list[Guard],
    stopped: DataDependentQuestion | None,
    owner: str | None,
    earlier: Callable[[int, str], Verdict | None] = lambda line, branch: None,
) -> Verdict:
    """The status of a decision, what decided it and what would take the other branch;
    ``earlier`` gives the verdict of the decision at another line of the same file when the
    trace took the given branch there (a name set in that branch was decided there)."""
    source = evidence.source
    if stopped is not None:
        return Verdict(
            "value",
            source,
            f"{stopped.question}() of {stopped.node.name}, whose {stopped.reason}",
            "any batch may take another branch: tracing stopped here; an opaque call or "
            "autowrap must own it (`attempt --fix` searches one)",
        )
    if guards:
        guard = guards[0]
        asked = f"{guard.question}({guard.node})"
        return Verdict(
            "shape",
            source,
            "; ".join(f"{g.question}({g.node}) == {g.expected!r}" for g in guards),
            f"a batch for which {asked} is not {guard.expected!r} takes the other branch: "
            "calibration refuses it before any weight changes (the guard is checked on every "
            "batch)",
        )
    by_kind: dict[str, list[Fact]] = {}
    for fact in evidence.facts:
        by_kind.setdefault(fact.kind, []).append(fact)
    if owner is not None:
        verdict = _judge_facts(by_kind, source, earlier)
        if "tensor" in by_kind:
            names = ", ".join(f.name for f in by_kind["tensor"])
            verdict = Verdict("value", source, f"the data of {names}", "")
        return Verdict(
            verdict.status,
            source,
            f"{verdict.decided_by}, inside the opaque call {owner}",
            f"decided again on every batch by the opaque call {owner}: nothing is baked in",
        )
    return _judge_facts(by_kind, source, earlier)


def _judge_facts(
    by_kind: dict[str, list[Fact]], source: str, earlier: Callable[[int, str], Verdict | None]
) -> Verdict:
    """The verdict of a condition no guard and no stopping question decided: from its own
    facts, or from the earlier decision that set a name it reads where that one says more
    (a status nearer the sample)."""
    own = _own_verdict(by_kind, source)
    # "a traced value" says less than the earlier decision that made it: that one wins a tie
    weak = set(by_kind) <= {"traced", "branch", "constant", "unknown"}
    for fact in by_kind.get("branch", []):
        found = [
            (int(at), earlier(int(at), branch))
            for at, branch in (entry.split(":") for entry in fact.value.split(","))
        ]
        line, before = next(((at, v) for at, v in found if v is not None), (0, None))
        rank, own_rank = STATUSES.index(before.status) if before else 99, STATUSES.index(own.status)
        if before is not None and (rank < own_rank or (weak and rank == own_rank)):
            chained = before.decided_by.startswith(f"{fact.name}, set ")
            return Verdict(
                before.status,
                source,
                before.decided_by
                if chained  # the same name, set further up: that decision explains it
                else f"{fact.name}, set by the branch the `if` at line {line} took: "
                f"{before.decided_by}",
                before.flips,
            )
    return own


def _own_verdict(by_kind: dict[str, list[Fact]], source: str) -> Verdict:
    for kind in ("input", "absent", "traced"):
        if kind in by_kind:
            return _sample_verdict(kind, by_kind[kind], source)
    if "config" in by_kind:
        facts = by_kind["config"]
        named = ", ".join(f"{f.name} = {f.value}" for f in facts)
        first = facts[0]
        flips = (
            f"a config with {first.name} set takes the other branch (another model: traced anew)"
            if first.value == "None"
            else f"a config whose {first.name} is not {first.value} can take the other branch "
            "(another model: traced anew)"
        )
        return Verdict("config", source, named, flips)
    if "training" in by_kind:
        return Verdict(
            "constant",
            source,
            f"{by_kind['training'][0].name} = False (traced in eval mode)",
            "none: calibration runs the model in eval mode too",
        )
    if "fixed" in by_kind:
        named = ", ".join(f"{f.name} = {f.value}" for f in by_kind["fixed"])
        return Verdict(
            "constant", source, f"{named} (set by the trace)", "none: every run passes the same"
        )
    if "unknown" in by_kind or "branch" in by_kind:
        named = ", ".join(
            [f"{f.name} = {f.value}" for f in by_kind.get("unknown", [])]
            + [
                f"{f.name} (set under the `if` at line {f.value})"
                for f in by_kind.get("branch", [])
            ]
        )
        return Verdict("unknown", source, f"{named}, whose origin was not found", "not known")
    named = ", ".join(f"{f.name} = {f.value}" for f in by_kind.get("constant", []))
    return Verdict("constant", source, named or "literals", "none: a constant of the model's code")


def _sample_verdict(kind: str, facts: list[Fact], source: str) -> Verdict:
    names = ", ".join(f.name for f in facts)
    if kind == "input":
        return Verdict(
            "shape",
            source,
            f"the sample gives {names}",
            f"a batch without {names} takes the other branch: this graph does not fit it (trace "
            "on such a batch)",
        )
    if kind == "absent":
        return Verdict(
            "shape",
            source,
            f"the sample has no {names}",
            f"a batch with {names} takes the other branch: this graph does not fit it (trace on "
            "such a batch)",
        )
    return Verdict(
        "shape",
        source,
        f"{names} is a traced value (its type or presence, not its data)",
        f"a batch giving {names} another type or leaving it out takes the other branch: this "
        "graph does not fit it (trace on such a batch)",
    )
