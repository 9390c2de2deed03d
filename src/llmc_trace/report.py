"""``TraceReport``: what ``attempt_trace`` found, for people (rich) and machines (JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.graph.verify import Verification
from llmc_trace.tracing.autowrap import StatementRewrite


@dataclass(frozen=True)
class SubgraphSummary:
    """One subgraph as the report shows it; byte counts are for the full-size model."""

    index: int
    targets: list[str]
    num_nodes: int
    input_names: list[str]
    output_names: list[str]
    consumed_names: list[str]
    output_bytes: int
    parameter_bytes: int

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class StructureCheck:
    """Does the tiny twin's trace have the full model's structure (up to layer count)?"""

    matches: bool
    differences: list[str]


@dataclass(frozen=True)
class FixAttempt:
    """One fix tried by ``attempt --fix``, and what came of it."""

    description: str
    ignore: list[str]
    outcome: str  # "verified", "fails further on", "still fails", "verification failed", "refused"
    cost: str = ""
    detail: str = ""
    rewrites: list[StatementRewrite] = field(default_factory=list)  # autowrap's before/after

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "rewrites": [r.to_json() for r in self.rewrites]}


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
    ignore: list[str]
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

    @property
    def ok(self) -> bool:
        return (
            self.traced
            and self.verification is not None
            and self.verification.ok
            and (self.structure is None or self.structure.matches)
        )

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
            "ignore": self.ignore,
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
        }
