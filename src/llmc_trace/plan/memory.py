"""``plan_memory``: estimate each pipeline's peak memory for a traced model, and choose one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import psutil
import torch

from llmc_trace.core.memory_limit import memory_limit
from llmc_trace.core.names import SEQUENTIAL
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.models.samples import SampleOptions, check_seq_len
from llmc_trace.models.source import resolve_model
from llmc_trace.pipelines.estimate import PLAN_BATCH, PLAN_SEQ, RunSettings
from llmc_trace.pipelines.residency import compute_dtype
from llmc_trace.plan.choose import MemoryPlan, choose_pipeline
from llmc_trace.plan.estimate import estimate_pipelines, moe_layer_hessians
from llmc_trace.plan.invariants import sample_invariant_names
from llmc_trace.traced.model import TracedModel, trace_source
from llmc_trace.traced.settle import settle
from llmc_trace.traced.twin import verify_on_twin
from llmc_trace.tracing.settings import TracingSettings, tracing_settings


def available_device_memory(device_is_host: bool) -> int:
    """Free memory where calibration runs: the current CUDA device's, or the host's available
    memory for a run on the CPU (whether or not the machine has a GPU).

    On CUDA that is the driver's free memory plus what this process's caching allocator holds
    reserved but unallocated: the driver counts those blocks as used, though the run will
    allocate from them first (a second run in one process would otherwise plan with less)."""
    if not device_is_host and torch.cuda.is_available():
        device = torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    return available_host_memory()


def available_host_memory() -> int:
    """The host memory this process can count on: the machine's available memory, or less
    where a limit on the process (a cgroup, ``ulimit -v``) leaves less."""
    machine = int(psutil.virtual_memory().available)
    limit = memory_limit()
    return machine if limit is None else min(machine, limit.available_bytes)


def plan_memory(
    traced: TracedModel,
    settings: RunSettings,
    *,
    twin: TracedModel | None = None,
    device_memory: int | None = None,
    host_memory: int | None = None,
) -> MemoryPlan:
    """The memory plan for calibrating ``traced.model`` with ``settings`` (nothing allocated).

    Intermediates are sized from ``traced``'s own example values, scaled from its sample's
    batch and sequence sizes to the run's. Which of them are equal for every sample is learnt
    by running the twin's subgraphs on two samples: ``twin`` when the caller verified one (its
    own trace), else a twin built and traced here. An untraced model gets a plan without the
    sequential pipeline.
    """
    excluded: dict[str, str] = {}
    invariant: set[str] = set()
    if traced.partitioned is None:
        kind = traced.failure.kind if traced.failure else "unknown"
        excluded[SEQUENTIAL] = (
            f"the model does not trace ({kind}); `attempt --fix` finds a fix to pass as "
            "--tracing-ignore (compress applies it itself)"
        )
    else:
        invariant = sample_invariant_names(twin or _twin_of(traced))
    estimates = estimate_pipelines(
        traced.model, traced.partitioned, settings, invariant, traced_sizes(traced)
    )
    plan = choose_pipeline(
        estimates,
        device_memory
        if device_memory is not None
        else available_device_memory(settings.device_is_host),
        host_memory if host_memory is not None else available_host_memory(),
        needs_data=settings.needs_data,
        excluded=excluded,
    )
    return dataclasses.replace(plan, experts=moe_layer_hessians(traced.model, settings))


def plan_source(
    model: str,
    settings: Sequence[RunSettings],
    *,
    modality: str = "text",
    tracing: TracingSettings | None = None,
    device_memory: int | None = None,
    host_memory: int | None = None,
    tracing_ignore: Sequence[str] | None = None,
    fix: bool = False,
) -> list[MemoryPlan]:
    """Trace ``model`` once on ``meta`` at the planning sizes (which collide with no model
    width, so every sequence and batch dimension can be told apart and scaled) and plan it for
    each of ``settings`` (one per stage of a recipe), with the model's own dtype for storage
    and the compute dtype of the device each names. A ``modality`` other than text traces on
    the config's own sample of it (a vision tower's patches are then counted), traced as
    ``tracing`` says (its ``tracing_ignore``: the fixes ``attempt --fix`` finds, added to the
    default list). ``tracing_ignore`` alone is the deprecated spelling of ``tracing``'s.
    A ``seq_len`` past the model's positions is refused as ``compress`` refuses it.

    ``fix``: where the model does not trace as given, plan the run ``compress`` makes, which
    settles the trace with the first fix the search verifies on the twin
    (:func:`~llmc_trace.traced.settle.settle`); each plan names it (``tracing_fix``)."""
    source = resolve_model(model)
    config = source.config()
    for run in settings:
        check_seq_len(config, run.seq_len)
    sample = SampleOptions(seq_len=PLAN_SEQ, batch_size=PLAN_BATCH)
    traced = trace_source(
        source,
        tracing=tracing_settings(tracing, "plan_source", {"tracing_ignore": tracing_ignore}),
        modality=modality,
        sample_options=sample,
    )
    twin: TracedModel | None = None
    applied: tuple[str, ...] = ()
    if fix and traced.partitioned is None:
        settled = settle(
            traced, lambda candidate: verify_on_twin(candidate, modality, sample), fix=True
        )
        if settled.applied is not None:
            traced, applied = settled.attempt.traced, tuple(settled.applied.tracing_ignore)
            check = settled.attempt.check
            twin = check.twin if check is not None and modality == "text" else None
    if twin is None and traced.partitioned is not None:
        twin = _twin_of(traced)  # once for every stage's plan, not once per stage
    storage = parameter_dtype(traced.model) or torch.float32
    plans = []
    for run in settings:
        device = torch.device("cpu" if run.device_is_host else "cuda")
        run = dataclasses.replace(
            run,
            storage_bytes=storage.itemsize,
            dtype_bytes=compute_dtype(storage, device).itemsize,
        )
        plan = plan_memory(
            traced, run, twin=twin, device_memory=device_memory, host_memory=host_memory
        )
        plans.append(dataclasses.replace(plan, tracing_fix=applied))
    return plans


def traced_sizes(traced: TracedModel) -> tuple[int, int]:
    """``(batch, sequence)`` of the sample ``traced`` was traced on (its token ids' shape)."""
    ids = traced.sample.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return int(ids.shape[0]), int(ids.shape[1])
    return PLAN_BATCH, PLAN_SEQ


def _twin_of(traced: TracedModel) -> TracedModel | None:
    """The twin of ``traced``, traced with the same options on text of its shape (the twin
    that :func:`~llmc_trace.traced.twin.verify_on_twin` proves it with)."""
    batch, seq = traced_sizes(traced)
    return verify_on_twin(traced, "text", SampleOptions(seq_len=seq, batch_size=batch)).twin
