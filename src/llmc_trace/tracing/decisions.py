"""Record every decision a trace bakes in: which branch each ``if``, loop and ternary of model code took.

A trace is one run of ``forward``; the graph keeps only the branches that run took. Guards
(:mod:`~llmc_trace.tracing.guards`) cover the questions asked of proxies; branches decided by
plain Python values (``self.config.sliding_window is None``, ``self.training``, whether the
sample has ``pixel_values``) leave no trace at all. :class:`DecisionRecorder` watches the trace
with :func:`sys.settrace`: every new frame costs one dictionary look-up, and only frames of model
code (transformers' modeling files, the model's own files, autowrapped statements, the
definitions of ``tracing_models/``) are followed instruction by instruction, to see each
conditional jump and where execution went on. Each jump is mapped to its construct and branch
(:mod:`~llmc_trace.tracing.branches`) and what decided it is judged
(:mod:`~llmc_trace.tracing.deciders`) from the frame, the guards asked while it was decided, and
the question that stopped the trace.

While the tracer computes example values (a leaf's ``forward`` on ``meta``), model frames are
left alone: a leaf decides again on every batch. The frames of an opaque call's example are
recorded with the call as their owner: they show the decisions that call takes per batch.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import transformers

from llmc_trace.tracing.branches import (
    Branching,
    branch_taken,
    branching_at,
    deciding_offsets,
    positions,
)
from llmc_trace.tracing.deciders import Evidence, gather_evidence, judge
from llmc_trace.tracing.guards import Guard
from llmc_trace.tracing.proxy import DataDependentQuestion
from llmc_trace.tracing.source import display_path, is_library_frame

if TYPE_CHECKING:
    from llmc_trace.tracing.tracer import LlmcTracer

_TRANSFORMERS = os.path.dirname(transformers.__file__) + os.sep
_MODELS = os.path.join(_TRANSFORMERS, "models") + os.sep
_MASKING = os.path.join(_TRANSFORMERS, "masking_utils.py")
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_VALUES = os.path.join(os.path.dirname(__file__), "values.py")
#: Statuses, sample-dependent ones first: the order ``attempt --decisions`` lists them in.
STATUSES = ("value", "shape", "config", "constant", "unknown")


@dataclass(frozen=True)
class Decision:
    """One branching construct of model code as the trace ran it.

    ``status`` says what decided it: ``shape`` (the sample's input signature: a guard on a
    shape, or which inputs it has; another batch re-traces), ``value`` (tensor data: the trace
    stopped there, or an opaque call owns it and decides per batch), ``config`` (a config
    attribute, named in ``decided_by``), ``constant`` (a Python constant of the trace, such as
    ``self.training``) or ``unknown``. ``taken`` counts the branches taken (``then``,
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
    def sample_dependent(self) -> bool:
        return self.status in ("shape", "value")

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


@dataclass
class _Site:
    """One deciding jump of one code object, over every time the trace ran it."""

    code: types.CodeType
    branching: Branching
    owner: str | None
    evidence: Evidence
    taken: Counter[str] = field(default_factory=Counter)
    guards: list[Guard] = field(default_factory=list)
    stopped: DataDependentQuestion | None = None


class DecisionRecorder:
    """Context manager recording the decisions of model code while ``tracer`` traces.

    ``inputs`` are the sample's tensor names (graph inputs), ``concrete`` the arguments the
    trace fixes (``use_cache=False``); both tell an input from a constant. Recording is off
    when not ``enabled`` and when another trace function is installed (a debugger, coverage):
    that one is never replaced.
    """

    def __init__(
        self,
        tracer: LlmcTracer,
        inputs: list[str],
        concrete: dict[str, Any],
        *,
        enabled: bool = True,
    ) -> None:
        self._enabled = enabled
        self._tracer = tracer
        self._inputs = frozenset(inputs)
        self._concrete = dict(concrete)
        self._watched: dict[types.CodeType, bool] = {}
        self._sites: dict[tuple[types.CodeType, int], _Site] = {}
        self._stopped_by: set[int] = set()
        self.active = False

    def __enter__(self) -> DecisionRecorder:
        if self._enabled and sys.gettrace() is None:
            self.active = True
            sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            sys.settrace(None)

    # ----------------------------------------------------------------- while tracing
    def _on_call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        watched = self._watched.get(code)
        if watched is None:
            filename = code.co_filename
            watched = self._watched[code] = (
                _is_model_file(filename) or filename == _MASKING
            ) and bool(deciding_offsets(code))
        if not watched:
            return None
        owner = None
        if self._tracer._computing:
            entry = _opaque_entry(frame)
            if entry is None:
                return None  # a leaf's own code: it decides again on every batch
            if entry is not frame and not _is_model_file(code.co_filename):
                return None  # a mask builder's helpers: the builder's own branches suffice
            owner = entry.f_code.co_qualname
        elif not _is_model_file(code.co_filename):
            return None
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        return _FrameWatch(self, code, owner)

    def _site(self, frame: types.FrameType, offset: int, owner: str | None) -> _Site | None:
        code = frame.f_code
        key = (code, offset)
        site = self._sites.get(key)
        if site is None:
            span = positions(code)[offset // 2]
            branching = branching_at(code.co_filename, span)  # type: ignore[arg-type]
            if branching is None:
                return None
            # an opaque call's arguments are its own, never the sample's inputs
            inputs = self._inputs if owner is None else frozenset()
            evidence = gather_evidence(branching.condition, frame, inputs, self._concrete)
            site = self._sites[key] = _Site(code, branching, owner, evidence)
        return site

    def _guards_since(self, mark: int) -> list[Guard]:
        return self._tracer.state.guards[mark:]

    def _guard_count(self) -> int:
        return len(self._tracer.state.guards)

    def _stopped(
        self, frame: types.FrameType, question: DataDependentQuestion, owner: str | None
    ) -> None:
        if id(question) in self._stopped_by:
            return  # outer frames see the same exception go by
        self._stopped_by.add(id(question))
        site = self._site(frame, frame.f_lasti, owner)
        if site is not None:
            site.stopped = question

    # ----------------------------------------------------------------- afterwards
    def decisions(self) -> list[Decision]:
        """Every construct the trace decided, sample-dependent first, then by file and line."""
        merged: dict[tuple[str, int, int], list[_Site]] = {}
        for site in self._sites.values():
            if not site.taken and site.stopped is None:
                continue  # an ``and`` step that never decided its construct
            key = (site.code.co_filename, site.branching.span[0], site.branching.span[2])
            merged.setdefault(key, []).append(site)
        decisions = [self._decision(sites) for sites in merged.values()]
        decisions.sort(key=lambda d: (STATUSES.index(d.status), d.file, d.line))
        return decisions

    def _decision(self, sites: list[_Site]) -> Decision:
        first = sites[0]
        branching = first.branching
        taken: Counter[str] = Counter()
        guards: list[Guard] = []
        stopped = None
        for site in sites:
            taken.update(site.taken)
            guards.extend(g for g in site.guards if g not in guards)
            stopped = stopped or site.stopped
        if stopped is not None:
            taken["stopped"] += 1
        verdict = judge(branching, first.evidence, guards, stopped, first.owner)
        return Decision(
            status=verdict.status,
            kind=branching.kind,
            file=display_path(first.code.co_filename),
            abs_file=first.code.co_filename,
            function=first.code.co_qualname,
            line=branching.line,
            source=verdict.source,
            taken=dict(taken),
            untaken=_untaken(branching, taken),
            decided_by=verdict.decided_by,
            flips=verdict.flips,
            owner=first.owner,
            guards=[g.describe() for g in guards],
        )


class _FrameWatch:
    """The local trace function of one model frame: sees each instruction before it runs."""

    __slots__ = ("recorder", "jumps", "owner", "pending", "pending_to", "mark", "code")

    def __init__(self, recorder: DecisionRecorder, code: types.CodeType, owner: str | None) -> None:
        self.recorder = recorder
        self.code = code
        self.jumps = deciding_offsets(code)
        self.owner = owner
        self.pending: int | None = None
        self.pending_to = 0
        self.mark = recorder._guard_count()

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            offset = frame.f_lasti
            if self.pending is not None:
                self._resolve(frame, self.pending, offset)
                self.pending = None
            if offset in self.jumps:
                self.pending = offset
                self.pending_to = self.jumps[offset]
        elif event == "exception" and isinstance(arg[1], DataDependentQuestion):
            self.recorder._stopped(frame, arg[1], self.owner)
        return self

    def _resolve(self, frame: types.FrameType, offset: int, destination: int) -> None:
        recorder = self.recorder
        site = recorder._site(frame, offset, self.owner)
        count = recorder._guard_count()
        if site is None:
            self.mark = count
            return
        branch = branch_taken(
            site.branching,
            positions(self.code)[destination // 2],
            destination == self.pending_to,  # type: ignore[arg-type]
        )
        if branch is None:
            return  # still inside the condition: its guards belong to the final step
        if count > self.mark:
            lines = range(site.branching.span[0], site.branching.span[1] + 1)
            for guard in recorder._guards_since(self.mark):
                where = guard.location
                if (
                    where is not None
                    and where.abs_file == self.code.co_filename
                    and where.line in lines
                ):
                    if guard not in site.guards:
                        site.guards.append(guard)
        self.mark = count
        site.taken[branch] += 1


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
    if branching.kind == "ternary" and branching.body == branching.orelse == (branching.line,) * 2:
        return spans  # both branches on the construct's own line: nothing to grey
    ran_body = bool({"then", "iterate"} & set(taken))
    ran_else = bool({"else", "exit"} & set(taken))
    if branching.body is not None and not ran_body:
        spans.append(branching.body)
    if branching.orelse is not None and not ran_else:
        spans.append(branching.orelse)
    return spans
