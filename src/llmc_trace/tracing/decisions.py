"""Record every decision a trace bakes in: which branch each ``if``, loop and ternary of model code took.

A trace is one run of ``forward``; the graph keeps only the branches that run took. Guards
(:mod:`~llmc_trace.tracing.guards`) cover the questions asked of proxies; branches decided by
plain Python values (``self.config.sliding_window is None``, ``self.training``, whether the
sample has ``pixel_values``) leave no trace at all. :class:`DecisionRecorder` runs the model's
files instrumented (:mod:`~llmc_trace.tracing.instrument`): each condition and loop of model
code (transformers' modeling files, the model's own files, the definitions of
``tracing_models/``) reports its outcome, and what decided it is judged
(:mod:`~llmc_trace.tracing.deciders`) from the frame, the guards the condition asked of proxies
and the question that stopped the trace.

While the tracer computes example values (a leaf's ``forward`` on ``meta``), model code is not
recorded: a leaf decides again on every batch. The branches of an opaque call's example are
recorded with the call as their owner: they show the decisions that call takes per batch.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import transformers

from llmc_trace.tracing.branches import Branching
from llmc_trace.tracing.deciders import STATUSES, Evidence, Verdict, gather_evidence, judge
from llmc_trace.tracing.guards import Guard
from llmc_trace.tracing.instrument import InstrumentedFile, instrumented
from llmc_trace.tracing.proxy import DataDependentQuestion
from llmc_trace.tracing.source import display_path, is_library_frame

if TYPE_CHECKING:
    from llmc_trace.tracing.tracer import LlmcTracer

_TRANSFORMERS = os.path.dirname(transformers.__file__) + os.sep
_MODELS = os.path.join(_TRANSFORMERS, "models") + os.sep
_MASKING = os.path.join(_TRANSFORMERS, "masking_utils.py")
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_VALUES = os.path.join(os.path.dirname(__file__), "values.py")


@dataclass(frozen=True)
class Decision:
    """One branching construct of model code as the trace ran it.

    ``status`` says what decided it: ``value`` (tensor data: the trace stopped there, or an
    opaque call, ``owner``, decides it per batch), ``shape`` (the sample's input signature: a
    guard on a shape, or which inputs it has; a batch that differs there does not fit the
    graph), ``config`` (a config attribute, named in ``decided_by``), ``constant`` (a Python
    constant of the trace, such as ``self.training``) or ``unknown``. ``taken`` counts the branches taken (``then``,
    ``else``, ``iterate``, ``exit``, ...); ``untaken`` holds the line ranges of branches never
    run. ``line`` is where the construct starts, ``source`` its condition.
    """

    status: str
    kind: str
    file: str
    abs_file: str
    function: str
    line: int
    source: str
    taken: dict[str, int]
    untaken: list[tuple[int, int]]
    decided_by: str
    flips: str
    owner: str | None = None
    guards: list[str] = field(default_factory=list)

    @property
    def unguarded(self) -> bool:
        """Data-dependent and owned by nothing: a branch the graph takes for every batch."""
        return self.status == "value" and self.owner is None

    def outcome(self) -> str:
        """The branches taken, as a person reads them (``then``, ``iterate x3, exit``)."""
        return ", ".join(
            f"{name} x{count}" if count > 1 else name for name, count in self.taken.items()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "kind": self.kind,
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "source": self.source,
            "taken": self.taken,
            "untaken": [list(span) for span in self.untaken],
            "decided_by": self.decided_by,
            "flips": self.flips,
            "owner": self.owner,
            "guards": self.guards,
        }


#: What each kind of construct calls its two outcomes (true, false).
_OUTCOMES = {
    "if": ("then", "else"),
    "elif": ("then", "else"),
    "ternary": ("then", "else"),
    "while": ("iterate", "exit"),
    "assert": ("held", "failed"),
}


@dataclass
class _Site:
    """One construct of one file, over every time the trace ran it."""

    filename: str
    function: str
    branching: Branching
    owner: str | None
    evidence: Evidence
    taken: Counter[str] = field(default_factory=Counter)
    guards: list[Guard] = field(default_factory=list)
    stopped: DataDependentQuestion | None = None


class DecisionRecorder:
    """Context manager recording the decisions of ``model``'s code while ``tracer`` traces it.

    ``is_leaf`` tells a leaf by its module path (its code is never traced); ``inputs`` are the
    names the model's ``forward`` accepts and the sample's tensors, ``concrete`` the arguments
    the trace fixes (``use_cache=False``); both tell an input from a constant. Nothing is
    recorded, and no code is swapped, unless ``enabled``.
    """

    def __init__(
        self,
        tracer: LlmcTracer,
        model: torch.nn.Module,
        is_leaf: Callable[[str], bool],
        inputs: list[str],
        concrete: dict[str, Any],
        *,
        enabled: bool = True,
    ) -> None:
        self._tracer = tracer
        self._model = model
        self._is_leaf = is_leaf
        self._inputs = frozenset(inputs)
        self._concrete = dict(concrete)
        self._enabled = enabled
        self._files: dict[str, InstrumentedFile] = {}
        self._sites: dict[tuple[str, int], _Site] = {}
        self._installed: Any = None
        self._by_line: dict[tuple[str, int], _Site] = {}

    def __enter__(self) -> DecisionRecorder:
        if self._enabled:
            self._installed = instrumented(model_modules(self._model, self._is_leaf), self)
            self._files = self._installed.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed is not None:
            self._installed.__exit__(*exc)
            self._installed = None

    # ----------------------------------------------------------------- called by model code
    def mark(self) -> int:
        """How many guards the trace holds: those after it were asked by the condition."""
        return len(self._tracer.state.guards)

    def decide(self, index: int, mark: int, value: Any) -> bool:
        """The truth of a condition, as the statement would take it, recorded."""
        frame = sys._getframe(1)
        try:
            result = bool(value)
        except DataDependentQuestion as question:
            self._stop(frame, index, question)
            raise
        site = self._site(frame, index, mark)
        if site is not None:
            site.taken[_OUTCOMES[site.branching.kind][0 if result else 1]] += 1
        return result

    def loop(self, index: int, mark: int, iterable: Iterable[Any]) -> Iterator[Any]:
        """The loop's iterator, counting its steps (and the exit, unless it breaks)."""
        frame = sys._getframe(1)
        try:
            iterator = iter(iterable)
        except DataDependentQuestion as question:
            self._stop(frame, index, question)
            raise
        site = self._site(frame, index, mark)
        return iterator if site is None else _counted(site, iterator)

    def _stop(self, frame: types.FrameType, index: int, question: DataDependentQuestion) -> None:
        site = self._site(frame, index, self.mark())
        if site is not None:
            site.stopped = question

    def stopped_by(self, error: BaseException) -> None:
        """Record the construct whose condition raised ``error``, a data-dependent question
        asked while evaluating it (``for x in enumerate(t.tolist())`` asks before the loop
        starts, so no hook saw it): the innermost model frame of its traceback is there."""
        if not isinstance(error, DataDependentQuestion):
            return
        if any(site.stopped is error for site in self._sites.values()):
            return
        innermost = None
        tb = error.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename in self._files:
                innermost = tb
            tb = tb.tb_next
        if innermost is None:
            return
        frame, line = innermost.tb_frame, innermost.tb_lineno
        sites = self._files[frame.f_code.co_filename].sites
        holding = [
            index
            for index, branching in enumerate(sites)
            if branching.condition_lines[0] <= line <= branching.condition_lines[1]
        ]
        if holding:
            index = max(holding, key=lambda i: sites[i].condition_lines[0])
            self._stop(frame, index, error)

    def _site(self, frame: types.FrameType, index: int, mark: int) -> _Site | None:
        """The record of construct ``index`` of ``frame``'s file, ``None`` when the frame is
        not recorded (a leaf's own code, a mask builder's helpers)."""
        code = frame.f_code
        filename = code.co_filename
        owner = None
        if self._tracer.computing:
            entry = _opaque_entry(frame)
            if entry is None or (entry is not frame and not _is_model_file(filename)):
                return None
            owner = entry.f_code.co_qualname
        elif not _is_model_file(filename):
            return None
        key = (filename, index)
        site = self._sites.get(key)
        if site is None:
            branching = self._files[filename].sites[index]
            # an opaque call's arguments are its own, never the sample's inputs
            inputs = self._inputs if owner is None else frozenset()
            evidence = gather_evidence(branching.condition_tree(), frame, inputs, self._concrete)
            site = _Site(filename, code.co_qualname, branching, owner, evidence)
            self._sites[key] = site
        for guard in self._tracer.state.guards[mark:]:
            where = guard.location
            if where is not None and where.abs_file == filename and guard not in site.guards:
                if where.function == code.co_qualname:
                    site.guards.append(guard)
        return site

    # ----------------------------------------------------------------- afterwards
    def decisions(self) -> list[Decision]:
        """Every construct the trace decided, sample-dependent first, then by file and line."""
        self._by_line = {(s.filename, s.branching.line): s for s in self._sites.values()}
        decisions = [self._decision(site) for site in self._sites.values()]
        decisions.sort(key=lambda d: (STATUSES.index(d.status), d.file, d.line))
        return decisions

    def _decision(self, site: _Site) -> Decision:
        branching = site.branching
        taken = Counter(site.taken)
        if site.stopped is not None:
            taken["stopped"] += 1
        verdict = self._verdict(site, frozenset())
        return Decision(
            status=verdict.status,
            kind=branching.kind,
            file=display_path(site.filename),
            abs_file=site.filename,
            function=site.function,
            line=branching.line,
            source=verdict.source,
            taken=dict(taken),
            untaken=_untaken(branching, taken),
            decided_by=verdict.decided_by,
            flips=verdict.flips,
            owner=site.owner,
            guards=[g.describe() for g in site.guards],
        )

    def _verdict(self, site: _Site, resolving: frozenset[int]) -> Verdict:
        """``site``'s verdict, reading through the earlier decisions that set its names
        (``resolving``: the sites being judged already, so a loop of them ends)."""

        def earlier(line: int, branch: str) -> Verdict | None:
            other = self._by_line.get((site.filename, line))
            if other is None or id(other) in resolving or other is site:
                return None
            if branch not in other.taken:
                return None  # that branch never ran: it set nothing
            return self._verdict(other, resolving | {id(site)})

        return judge(site.evidence, site.guards, site.stopped, site.owner, earlier)


def _counted(site: _Site, iterator: Iterator[Any]) -> Iterator[Any]:
    for item in iterator:
        site.taken["iterate"] += 1
        yield item
    site.taken["exit"] += 1


def model_modules(model: torch.nn.Module, is_leaf: Callable[[str], bool]) -> list[types.ModuleType]:
    """The modules whose code a trace of ``model`` runs: those defining the classes (and their
    bases) of the modules it traces through and of its leaves, when they are model code, and
    transformers' mask builders. A leaf's children are never reached (a model of thousands of
    experts is walked in its few traced modules)."""
    classes: set[type] = set()
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        path, module = stack.pop()
        classes.add(type(module))
        if path and is_leaf(path):
            continue
        prefix = f"{path}." if path else ""
        stack.extend(
            (prefix + name, child) for name, child in module._modules.items() if child is not None
        )
    names: dict[str, None] = {}
    for cls in classes:
        for base in cls.__mro__:
            names.setdefault(base.__module__, None)
    modules = []
    for name in [*names, "transformers.masking_utils"]:
        module = sys.modules.get(name)
        filename = getattr(module, "__file__", None)
        if module is not None and filename and (_is_model_file(filename) or filename == _MASKING):
            modules.append(module)
    return modules


def _is_model_file(filename: str) -> bool:
    """Model code: transformers' modeling files, and files outside every installed library
    (the model's own code, remote code, ``tracing_models/``, a test's model)."""
    if filename.startswith(_MODELS):
        return True
    if filename.startswith("<") or filename.startswith(_TRANSFORMERS) or is_library_frame(filename):
        return False
    return "site-packages" not in filename and not filename.startswith(_STDLIB)


def _opaque_entry(frame: types.FrameType) -> types.FrameType | None:
    """The frame of the opaque call whose example value ``frame`` helps compute, or ``None``
    for a leaf module's (or a tensor method's) computation: the first frame of model or
    mask-builder code below ``compute_value``."""
    chain: list[types.FrameType] = []
    current: types.FrameType | None = frame
    while current is not None and current.f_code.co_filename != _VALUES:
        chain.append(current)
        current = current.f_back
    if current is None:
        return None
    for entry in reversed(chain):  # wrappers (ours, transformers' decorators) are passed
        filename = entry.f_code.co_filename
        if filename == _MASKING or _is_model_file(filename):
            return entry
        if "torch" + os.sep + "nn" + os.sep in filename:
            return None  # Module.__call__: a leaf
    return None


def _untaken(branching: Branching, taken: Counter[str]) -> list[tuple[int, int]]:
    """Line ranges of the branches the trace never ran (for the source view)."""
    spans: list[tuple[int, int]] = []
    ran_body = bool({"then", "iterate"} & set(taken))
    ran_else = bool({"else", "exit"} & set(taken))
    if branching.body is not None and not ran_body:
        spans.append(branching.body)
    if branching.orelse is not None and not ran_else:
        spans.append(branching.orelse)
    return spans
