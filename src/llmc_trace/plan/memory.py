"""``plan_memory``: trace a model on ``meta`` at planning sizes, estimate, and choose."""

from __future__ import annotations

import psutil
import torch

from llmc_trace.graph.partition import partition_trace
from llmc_trace.models.build import build_meta_model
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.plan.choose import MemoryPlan, choose_pipeline
from llmc_trace.plan.estimate import PLAN_BATCH, PLAN_SEQ, RunSettings, estimate_pipelines
from llmc_trace.plan.invariants import sample_invariant_names
from llmc_trace.tracing.trace import trace_graph


def available_device_memory() -> int:
    """Free memory of the CUDA device when there is one, else the host's available memory."""
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    return int(psutil.virtual_memory().available)


def plan_memory(
    model: str | ModelSource,
    settings: RunSettings,
    *,
    device_memory: int | None = None,
    host_memory: int | None = None,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
) -> MemoryPlan:
    """The memory plan for calibrating ``model`` with ``settings`` (nothing is allocated)."""
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    meta_model = build_meta_model(source)
    sample = make_sample(
        meta_model.config, "text", SampleOptions(seq_len=PLAN_SEQ, batch_size=PLAN_BATCH)
    )
    excluded: dict[str, str] = {}
    invariant: set[str] = set()
    try:
        partitioned = partition_trace(trace_graph(meta_model, sample, sequential_targets, ignore))
        invariant = sample_invariant_names(
            source,
            SampleOptions(seq_len=PLAN_SEQ, batch_size=PLAN_BATCH),
            sequential_targets,
            ignore,
        )
    except Exception as err:  # an untraceable model still gets a plan, without sequential
        partitioned = None
        excluded["sequential"] = f"the model does not trace ({type(err).__name__})"
    estimates = estimate_pipelines(meta_model, partitioned, settings, invariant)
    return choose_pipeline(
        estimates,
        device_memory if device_memory is not None else available_device_memory(),
        host_memory if host_memory is not None else int(psutil.virtual_memory().available),
        needs_data=settings.needs_data,
        excluded=excluded,
    )
