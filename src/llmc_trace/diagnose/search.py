"""Search for the fixes that make an untraceable model trace and verify, round by round.

Each round takes the failure at hand, tries its candidate fixes in order
(:func:`~llmc_trace.diagnose.fixes.candidate_fixes`) and keeps the first whose retry verifies,
or moves the failure further on (a later line: the next round fixes that one). The search
stops when the model verifies, a round accepts nothing, or after :data:`MAX_FIX_ROUNDS`.

Fixes known beforehand (the ones ``coverage --all`` verified for the model's type) are
*seeds*: tried first, as one candidate, in the first round. A seed is a shortcut, never the
whole search: when it verifies the search ends there, when it moves the failure on the search
continues from the failure it leaves, and when it does neither the round goes on with the
failure's own candidates, so a fix that holds on another config is still found here.
How a retry traces and verifies is the caller's business: this module only decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.core.deprecation import renamed
from llmc_trace.diagnose.fixes import Fix, candidate_fixes
from llmc_trace.errors import BadInputError
from llmc_trace.tracing.autowrap import StatementRewrite

#: Fixes applied one after another before giving up (each round fixes one failure).
MAX_FIX_ROUNDS = 4


@dataclass(frozen=True)
class FixAttempt:
    """One fix tried, and what came of it."""

    description: str
    tracing_ignore: list[str]
    outcome: str  # "verified", "fails further on", "still fails", "verification failed", "refused"
    cost: str = ""
    detail: str = ""
    rewrites: list[StatementRewrite] = field(default_factory=list)  # autowrap's before/after

    @property
    def ignore(self) -> list[str]:
        """Deprecated: :attr:`tracing_ignore` (removed in the next release)."""
        renamed("FixAttempt.ignore", "FixAttempt.tracing_ignore")
        return self.tracing_ignore

    def to_json(self) -> dict[str, Any]:
        """As ``attempt --json`` prints it (the tracing list under its key ``ignore``)."""
        document = {**vars(self), "rewrites": [r.to_json() for r in self.rewrites]}
        document["ignore"] = document.pop("tracing_ignore")
        return document


class Trial(Protocol):
    """What a retry must say: did it verify, and if not, where did tracing stop?"""

    @property
    def ok(self) -> bool: ...

    @property
    def failure(self) -> TraceFailure | None: ...


T = TypeVar("T", bound=Trial)


@dataclass(frozen=True)
class FixSearch(Generic[T]):
    """The last accepted trial (the first one when nothing was accepted), every fix tried, and
    the combined fix when the result verifies."""

    result: T
    tried: list[FixAttempt]
    applied: FixAttempt | None


def search_fixes(
    first: T,
    model: torch.nn.Module,
    retry: Callable[[list[str]], T],
    seeds: Sequence[Fix] = (),
    *,
    rounds: int = MAX_FIX_ROUNDS,
) -> FixSearch[T]:
    """Fix ``first`` (which failed to trace) by retrying with ``ignore`` entries added.

    ``retry(entries)`` traces and verifies again with ``entries`` added to the caller's
    ``ignore``; it raises :class:`~llmc_trace.errors.BadInputError` when an entry cannot be
    installed. A candidate that cannot apply (autowrap refusing a statement that returns,
    say) is reported with its reason and costs no trace. ``seeds`` are tried before the
    first round's own candidates (see the module docstring). ``rounds`` bounds the failures
    fixed one after another.
    """
    result = first
    applied: list[Fix] = []
    tried: list[FixAttempt] = []
    for round_index in range(rounds):
        failure = result.failure
        if result.ok or failure is None:
            break
        accepted = False
        offered = list(seeds) if round_index == 0 else []
        for fix in offered + candidate_fixes(failure, model):
            rewrites = list(fix.rewrites)
            refusal = fix.refusal
            if not refusal:
                try:
                    trial = retry(
                        [n for f in applied for n in f.tracing_ignore] + list(fix.tracing_ignore)
                    )
                except BadInputError as err:  # the fix's own entry cannot be installed
                    refusal = err.message
            if refusal:
                tried.append(
                    FixAttempt(
                        fix.description, list(fix.tracing_ignore), "refused", "", refusal, rewrites
                    )
                )
                continue
            moved_on = trial.failure is not None and trial.failure.location != failure.location
            tried.append(
                FixAttempt(
                    fix.description,
                    list(fix.tracing_ignore),
                    _outcome(trial, moved_on),
                    fix.cost,
                    trial.failure.exception if trial.failure else "",
                    rewrites,
                )
            )
            if trial.ok or moved_on:
                applied.append(fix)
                result, accepted = trial, True
                break
        if not accepted:
            break
    combined = None
    if applied and result.ok:
        combined = FixAttempt(
            "; ".join(f.description for f in applied),
            [n for f in applied for n in f.tracing_ignore],
            "verified",
            "; ".join(f.cost for f in applied if f.cost),
            rewrites=[rewrite for f in applied for rewrite in f.rewrites],
        )
    return FixSearch(result, tried, combined)


def _outcome(trial: Trial, moved_on: bool) -> str:
    if trial.ok:
        return "verified"
    if moved_on:
        return "fails further on"
    return "still fails" if trial.failure else "verification failed"
