"""A stage's memory plan: what its run will hold on the device and the host, and the pipeline
that fits; for fused experts that do not fit together, the largest group that does; a run
that cannot fit a memory limit set on the process stops before it reads a weight."""

from __future__ import annotations

import dataclasses
import math

import torch

from llmc_trace.core.memory_limit import MemoryLimit
from llmc_trace.core.sizes import human_bytes
from llmc_trace.errors import BadInputError
from llmc_trace.moe import fused_experts
from llmc_trace.core.names import AUTO, CALIBRATED_METHODS
from llmc_trace.spec.settings import CalibrationSettings
from llmc_trace.spec.stage import Stage
from llmc_trace.plan import MemoryPlan, RunSettings, plan_memory
from llmc_trace.traced.model import TracedModel
from llmc_trace.traced.twin import TwinCheck


def plan_stage(
    traced: TracedModel,
    check: TwinCheck | None,
    stage: Stage,
    calibration: CalibrationSettings,
    *,
    ranks: int,
    storage: torch.dtype,
    compute: torch.dtype,
    streamed: bool,
    device: torch.device,
) -> tuple[MemoryPlan, Stage]:
    """The plan of ``stage`` on one of ``ranks`` ranks (each caches and calibrates its share
    of the rows), and the stage as it will run: when the plan does not fit, no expert group
    was given and the model has fused experts, with the largest group that fits."""
    needs_data = stage.method in CALIBRATED_METHODS
    settings = RunSettings(
        math.ceil(calibration.samples / ranks),
        calibration.seq_len,
        calibration.batch_size,
        dtype_bytes=compute.itemsize,
        storage_bytes=storage.itemsize,
        needs_data=needs_data,
        kept_bytes_per_weight=1.0 if stage.quantizes else 0.0,
        streamed=streamed,
        device_is_host=device.type == "cpu",
        expert_group=stage.expert_group,
        attention=calibration.attn_implementation,
    )
    twin = check.twin if check else None
    plan = plan_memory(traced, settings, twin=twin)
    if plan.fits or stage.expert_group is not None or not needs_data:
        return plan, stage
    if fused_experts(traced.model):
        group = 64
        while group >= 1:  # halving: the largest group whose Hessians fit beside the rest
            settings = dataclasses.replace(settings, expert_group=group)
            bounded = plan_memory(traced, settings, twin=twin)
            if bounded.fits:
                return bounded, dataclasses.replace(stage, expert_group=group)
            group //= 2
    return plan, stage


def check_memory_limit(plan: MemoryPlan, pipeline: str, limit: MemoryLimit | None) -> None:
    """A run whose ``pipeline`` (``auto``: the plan's choice) needs more host memory than a
    limit set on the process leaves (:mod:`~llmc_trace.core.memory_limit`) stops here, before
    a weight is read, with the plan's figures: past the limit, the OOM killer or a failed
    allocation would end it hours in. Without a limit, a plan that does not fit the machine
    is left to run (its estimates bound the peak from above)."""
    if limit is None:
        return
    name = plan.chosen if pipeline == AUTO else pipeline
    if name not in plan.pipelines():
        return
    chosen = plan.estimate(name)
    if chosen.host_bytes <= limit.available_bytes:
        return
    raise BadInputError(
        f"the run needs {human_bytes(chosen.host_bytes)} of host memory ({name}, of "
        f"which {human_bytes(chosen.cache_bytes)} cached activations), and the memory limit "
        f"({limit.source}, {human_bytes(limit.limit_bytes)}) leaves "
        f"{human_bytes(limit.available_bytes)}; nothing was loaded.",
        hint="Raise the limit, or calibrate fewer --samples or a shorter --seq-len "
        "(`llmc-trace plan` shows each pipeline's peaks).",
    )
