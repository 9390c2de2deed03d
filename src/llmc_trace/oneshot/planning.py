"""A stage's memory plan: what its run will hold on the device and the host, and the pipeline
that fits; for fused experts that do not fit together, the largest group that does."""

from __future__ import annotations

import dataclasses
import math

import torch

from llmc_trace.moe import fused_experts
from llmc_trace.core.names import CALIBRATED_METHODS
from llmc_trace.oneshot.settings import CalibrationSettings
from llmc_trace.oneshot.stage import Stage
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
    if not fused_experts(traced.model):
        return plan, stage
    group = 64
    while group >= 1:  # halving: the largest group whose Hessians fit beside the rest
        bounded = plan_memory(traced, dataclasses.replace(settings, expert_group=group), twin=twin)
        if bounded.fits:
            return bounded, dataclasses.replace(stage, expert_group=group)
        group //= 2
    return plan, stage
