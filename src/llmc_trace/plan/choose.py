"""Choose a calibration pipeline from the estimates, and say why.

Preference follows quality, then memory: ``sequential`` (error propagation, one subgraph on the
device) when the model traces and it fits; ``layer_sequential`` when it is exact for this model
and fits; ``basic`` when the whole model fits; compressors that need no data use ``data_free``.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc_trace.core.names import DATA_FREE, PREFERENCE
from llmc_trace.pipelines.estimate import PipelineEstimate
from llmc_trace.plan.estimate import ExpertHessians


@dataclass(frozen=True)
class MemoryPlan:
    """Per-pipeline estimates, the choice, and the reason for it."""

    estimates: list[PipelineEstimate]
    device_memory: int
    host_memory: int
    chosen: str
    reason: str
    fits: bool
    #: MoE layers and the largest one's expert Hessians (:func:`~.estimate.moe_layer_hessians`)
    experts: tuple[int, ExpertHessians] | None = None
    #: the ``tracing_ignore`` entries the fix search added to trace the model (as compress adds
    #: them), empty when it traced as given
    tracing_fix: tuple[str, ...] = ()

    def estimate(self, pipeline: str) -> PipelineEstimate:
        return next(e for e in self.estimates if e.pipeline == pipeline)

    def pipelines(self) -> list[str]:
        """The pipelines this plan estimated (sequential only when the model traced)."""
        return [e.pipeline for e in self.estimates]


def choose_pipeline(
    estimates: list[PipelineEstimate],
    device_memory: int,
    host_memory: int,
    *,
    needs_data: bool = True,
    excluded: dict[str, str] | None = None,
) -> MemoryPlan:
    """Pick the preferred pipeline whose device and host estimates fit."""
    excluded = excluded or {}
    by_name = {e.pipeline: e for e in estimates}
    if not needs_data:
        return MemoryPlan(
            estimates,
            device_memory,
            host_memory,
            DATA_FREE,
            "the compressor needs no calibration data",
            True,
        )
    rejected = []
    for name in PREFERENCE:
        if name in excluded:
            rejected.append(f"{name}: {excluded[name]}")
            continue
        estimate = by_name.get(name)
        if estimate is None:
            rejected.append(f"{name}: not available (the model did not trace)")
            continue
        if estimate.device_bytes > device_memory:
            rejected.append(f"{name}: needs {_gib(estimate.device_bytes)} on the device")
            continue
        if estimate.host_bytes > host_memory:
            rejected.append(f"{name}: needs {_gib(estimate.host_bytes)} of host memory")
            continue
        reason = (
            f"{name} fits ({_gib(estimate.device_bytes)} device, {_gib(estimate.host_bytes)} host)"
        )
        if rejected:
            reason += "; rejected " + "; ".join(rejected)
        return MemoryPlan(estimates, device_memory, host_memory, name, reason, True)
    candidates = [by_name[n] for n in PREFERENCE if n in by_name and n not in excluded]
    smallest = min(candidates, key=lambda e: e.device_bytes)
    return MemoryPlan(
        estimates,
        device_memory,
        host_memory,
        smallest.pipeline,
        "nothing fits; " + "; ".join(rejected) + f"; {smallest.pipeline} needs the least",
        False,
    )


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"
