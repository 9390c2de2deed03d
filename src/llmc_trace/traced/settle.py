"""``settle``: a trace as written, else with the first fix the search verifies.

Every caller that needs a trace it can calibrate through settles it the same way: ``attempt
--fix`` on a built-in or a checkpoint, ``trace_subgraphs`` on a caller's model, ``compress`` on
its first calibration batch, ``plan`` at its planning sizes. The trace is proved (``check``,
on the tiny twin), and when it stops or does not verify the fix search
(:mod:`llmc_trace.diagnose.search`) retraces the same built model with one more fix each round;
the fix ``coverage --all`` verified for the model's type is its first candidate, never the
whole search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmc_trace.diagnose.failure import TraceFailure, failure_from_replay
from llmc_trace.diagnose.fixes import Fix, as_rewritten, describe_entry, preview_rewrites
from llmc_trace.diagnose.search import FixAttempt, search_fixes
from llmc_trace.diagnose.swept import swept_fix, swept_transformers
from llmc_trace.traced.model import TracedModel, trace_model
from llmc_trace.traced.twin import TwinCheck, sample_modality


@dataclass(frozen=True)
class Attempt:
    """A traced model and its proof; ``ok`` means traced and verified."""

    traced: TracedModel
    check: TwinCheck | None

    @property
    def ok(self) -> bool:
        return self.traced.traced and self.check is not None and self.check.ok

    @property
    def failure(self) -> TraceFailure | None:
        """Where tracing stopped, else where the replay failed (the search fixes either)."""
        if self.traced.failure is not None or self.check is None:
            return self.traced.failure
        return failure_from_replay(self.check.verification)


@dataclass(frozen=True)
class SettledTrace:
    """What :func:`settle` found: the first attempt, the one it settled on (further along when
    a fix moved the failure on), the fixes it tried, and the combined fix that verified."""

    first: Attempt
    attempt: Attempt
    tried: list[FixAttempt]
    applied: FixAttempt | None

    @property
    def fixed(self) -> Attempt:
        """The attempt with the verified fix, else the first one: what a run should use."""
        return self.attempt if self.applied is not None else self.first


def settle(
    traced: TracedModel,
    check: Callable[[TracedModel], TwinCheck] | None,
    *,
    fix: bool,
    proved: Attempt | None = None,
) -> SettledTrace:
    """Verify ``traced`` with ``check``; when it did not trace and ``fix`` is set, search fixes,
    each retry tracing ``traced.model`` on ``traced.sample`` with the fix added. The fix the
    sweep verified for the model's type seeds the search; it never replaces it.

    ``check=None`` skips verification (the attempt is then never ``ok``). ``proved``: the
    attempt a caller already made of ``traced`` with ``check`` (a sweep that settles without
    fixes first), which is then not verified again.
    """

    def prove(candidate: TracedModel) -> Attempt:
        verified = check(candidate) if check is not None and candidate.traced else None
        return Attempt(candidate, verified)

    def retry(entries: list[str]) -> Attempt:
        options = traced.options.with_tracing_ignore(traced.model, entries)
        return prove(
            trace_model(
                traced.model, traced.sample, options, name=traced.name, source=traced.source
            )
        )

    first = proved or prove(traced)
    if not fix or first.ok or first.failure is None:
        return SettledTrace(first, first, [], None)
    found = search_fixes(first, traced.model, retry, _swept_seeds(traced))
    return SettledTrace(first, found.result, found.tried, found.applied)


def _swept_seeds(traced: TracedModel) -> list[Fix]:
    """The fix ``coverage --all`` verified for the model's type, if it found one
    (:mod:`~llmc_trace.diagnose.swept`), as the search's seed: tried first and proved on this
    model like any candidate; the search goes on from whatever failure it leaves."""
    model_type = getattr(getattr(traced.model, "config", None), "model_type", None)
    entries = swept_fix(model_type, sample_modality(traced.sample)) if model_type else []
    if not entries:
        return []
    rewrites = preview_rewrites(traced.model, tuple(entries))
    named = as_rewritten(tuple(entries), rewrites)
    described = [describe_entry(entry) for entry in named]
    description = "; ".join(what for what, _ in described) + (
        f" (verified for {model_type} by `coverage --all` on transformers {swept_transformers()})"
    )
    cost = "; ".join(cost for _, cost in described)
    return [Fix("swept", named, description, cost, rewrites)]
