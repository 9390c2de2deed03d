"""``TraceReport``: what ``attempt_trace`` found, for people (rich) and machines (JSON)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from llmc_trace.core.deprecation import renamed
from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.diagnose.search import FixAttempt
from llmc_trace.errors import DotNotFoundError
from llmc_trace.graph.structure import StructureCheck
from llmc_trace.graph.verify import Verification
from llmc_trace.traced.model import TracedModel
from llmc_trace.traced.summary import SubgraphSummary
from llmc_trace.traced.twin import TwinCheck
from llmc_trace.tracing.decisions import Decision


@dataclass(frozen=True)
class TraceReport:
    """The answer of :func:`llmc_trace.attempt_trace`.

    ``ok`` means traced on the full-size config *and* verified on the tiny twin (or the real
    weights). ``failure`` is set when tracing stopped; ``fixes`` lists what ``fix=True`` tried.
    """

    model: str
    architecture: str
    modality: str
    sequential_targets: list[str]
    tracing_ignore: list[str]
    targets_per_subgraph: int
    traced: bool
    subgraphs: list[SubgraphSummary]
    timings_s: dict[str, float]
    verification: Verification | None = None
    verified_on: str = ""
    structure: StructureCheck | None = None
    failure: TraceFailure | None = None
    guards: list[str] = field(default_factory=list)
    opaque_functions: list[str] = field(default_factory=list)
    leaves: dict[str, int] = field(default_factory=dict)
    fixes: list[FixAttempt] = field(default_factory=list)
    applied_fix: FixAttempt | None = None
    requested_targets: list[str] = field(default_factory=list)  # as the user wrote them
    decisions: list[Decision] = field(default_factory=list)  # when recorded, see attempt_trace
    #: the traced model itself (not part of the JSON), to draw or plan without tracing again
    traced_model: TracedModel | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(
        cls,
        traced: TracedModel,
        check: TwinCheck | None,
        modality: str,
        requested_targets: list[str] | None = None,
    ) -> TraceReport:
        """The report on ``traced`` and its proof (fixes are added by whoever searched them)."""
        trace = traced.trace
        leaves: dict[str, int] = {}
        if trace is not None:
            for reason in trace.leaf_reasons.values():
                leaves[reason] = leaves.get(reason, 0) + 1
        return cls(
            model=traced.name,
            architecture=type(traced.model).__name__,
            modality=modality,
            sequential_targets=list(traced.leaves.targets)
            if trace
            else list(requested_targets or []),
            tracing_ignore=traced.options.tracing_ignore(),
            targets_per_subgraph=traced.options.targets_per_subgraph,
            traced=traced.traced,
            subgraphs=traced.summaries,
            timings_s={**traced.timings_s, **(check.timings_s if check else {})},
            verification=check.verification if check else None,
            verified_on=check.verified_on if check else "",
            structure=check.structure if check else None,
            failure=traced.failure,
            guards=[g.describe() for g in trace.guards] if trace else [],
            opaque_functions=list(trace.opaque_recorded) if trace else [],
            leaves=dict(sorted(leaves.items())),
            requested_targets=list(requested_targets or []),
            decisions=list(traced.decisions),
            traced_model=traced,
        )

    def _repr_html_(self) -> str | None:
        """A notebook shows the traced model's page, the one ``render`` writes: the overview
        that unfolds in place, or the failure view when the model did not trace. ``None``
        (the plain repr) for a report without its traced model."""
        if self.traced_model is None:
            return None
        # here, not at the top: compress imports this module with attempt.prove (for ``settle``)
        # and needs neither the render package nor Graphviz
        from llmc_trace.render import iframe, render_page

        try:
            return iframe(render_page(self.traced_model))
        except DotNotFoundError as err:
            return f"<p>{html.escape(str(err))}</p>"

    @property
    def ok(self) -> bool:
        return (
            self.traced
            and self.verification is not None
            and self.verification.ok
            and (self.structure is None or self.structure.matches)
        )

    @property
    def ignore(self) -> list[str]:
        """Deprecated: :attr:`tracing_ignore` (removed in the next release)."""
        renamed("TraceReport.ignore", "TraceReport.tracing_ignore")
        return self.tracing_ignore

    def to_json(self) -> dict[str, Any]:
        verification = None
        if self.verification is not None:
            v = self.verification
            verification = {
                "ok": v.ok,
                "on": self.verified_on,
                "tolerance": v.tolerance,
                "max_abs_diff": v.max_abs_diff,
                "outputs": [
                    {
                        "name": o.name,
                        "shape": list(o.shape),
                        "max_abs_diff": o.max_abs_diff,
                        "matches": o.matches,
                    }
                    for o in v.outputs
                ],
                "problems": v.problems,
            }
        return {
            "ok": self.ok,
            "model": self.model,
            "architecture": self.architecture,
            "modality": self.modality,
            "sequential_targets": self.sequential_targets,
            "ignore": self.tracing_ignore,
            "targets_per_subgraph": self.targets_per_subgraph,
            "traced": self.traced,
            "num_subgraphs": len(self.subgraphs),
            "subgraphs": [s.to_json() for s in self.subgraphs],
            "timings_s": {k: round(v, 4) for k, v in self.timings_s.items()},
            "verification": verification,
            "structure": None
            if self.structure is None
            else {"matches": self.structure.matches, "differences": self.structure.differences},
            "failure": None if self.failure is None else self.failure.to_json(),
            "guards": self.guards,
            "opaque_functions": self.opaque_functions,
            "leaves": self.leaves,
            "fixes": [f.to_json() for f in self.fixes],
            "applied_fix": None if self.applied_fix is None else self.applied_fix.to_json(),
            "decisions": [d.to_json() for d in self.decisions],
        }
