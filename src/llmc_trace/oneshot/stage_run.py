"""One stage of a run, as its steps: compressor, trace, plan, calibrate (into a checkpoint or
in memory), result."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from llmc_trace.moe import router_layers
from llmc_trace.core.names import (
    AUTO,
    AWQ,
    CALIBRATED_METHODS,
    RTN,
    SEQUENTIAL,
    SMOOTHING_METHODS,
)
from llmc_trace.core.device import HOST
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.graph.literals import META, retarget_literals
from llmc_trace.models.parts import model_parts
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.oneshot.compressor import LayerCompressor
from llmc_trace.oneshot.pairs import stage_mappings
from llmc_trace.oneshot.smoothing import Smoother, SmoothingCompressor
from llmc_trace.traced.mappings import MappingSet
from llmc_trace.oneshot.coverage import parameter_coverage
from llmc_trace.core.memory_limit import memory_limit
from llmc_trace.oneshot.planning import check_memory_limit, plan_stage
from llmc_trace.oneshot.result import StageResult
from llmc_trace.oneshot.stage import Stage
from llmc_trace.oneshot.state import Pruned, RunState
from llmc_trace.oneshot.targets import check_ignore, check_targets
from llmc_trace.oneshot.write import calibrate_into_checkpoint
from llmc_trace.pipelines.calibration import Calibration
from llmc_trace.pipelines.registry import fallback_order, run_pipelines
from llmc_trace.pipelines.residency import InMemory, Residency, compute_dtype
from llmc_trace.pipelines.resume import ResumePoints


def run_stage(
    run: RunState,
    stage: Stage,
    model: torch.nn.Module,
    store: WeightStore | None,
    out: Path | None,
    *,
    last: bool,
) -> None:
    """Compress ``model`` as ``stage`` says (every fused expert already visible as its own
    projections), streamed from ``store`` into ``out`` or in memory; its result joins
    ``run.results``."""
    storage = parameter_dtype(model)
    assert storage is not None  # loading refuses a model without floating-point weights
    batches = run.calibration_set(model).batches
    routers = router_layers(model)
    parts = model_parts(model)
    towers = [] if stage.towers else parts.in_towers(n for n, _ in model.named_modules())
    compressor = _compressor(run, stage, storage, skip=frozenset((*routers, *towers)))
    targets = check_targets(model, compressor, run.request.source.name)
    check_ignore(model, stage)
    run.progress("trace", 0, 1)
    needs_data = stage.method in CALIBRATED_METHODS
    traced, check = run.trace.trace(model, batches[0], needs_data=needs_data)
    if isinstance(compressor, SmoothingCompressor):
        compressor.smoother.mappings = stage_mappings(run, model, batches[0], compressor)
    compute = compute_dtype(storage, device=run.device)
    subgraphs = traced.subgraphs if traced.traced else []
    retarget_literals(subgraphs, storage, compute)
    retarget_literals(subgraphs, META, run.device)  # a skeleton's `self.device`, streamed
    plan, stage = plan_stage(
        traced, check, stage, run.request.calibration, ranks=run.world.size, storage=storage,
        compute=compute, streamed=store is not None, device=run.device,
    )  # fmt: skip
    check_memory_limit(plan, stage.pipeline, memory_limit())
    compressor.expert_group = stage.expert_group
    order = fallback_order(
        plan.chosen if stage.pipeline == AUTO else stage.pipeline, plan.pipelines()
    )
    if run.unfinished is not None:  # its shards hold that pipeline's tensors
        order = [run.unfinished.pipeline]

    def calibrate(residency: Residency, resume: ResumePoints | None = None):  # type: ignore[no-untyped-def]
        calibration = Calibration(
            traced, run.world.shard(batches), compressor, run.device,
            propagate_error=stage.propagate, true_sequential=stage.true_sequential,
            progress=run.progress, residency=residency, twin=check.twin if check else None,
            resume=resume,
        )  # fmt: skip
        return run_pipelines(order, calibration)

    if stage.prunes:
        run.pruned = Pruned(stage.sparsity, targets)
    if store is None or out is None:
        outcome = calibrate(InMemory(HOST, compute))
    else:
        outcome = calibrate_into_checkpoint(
            run, stage, model, store, out, calibrate=calibrate, compressor=compressor,
            targets=targets, storage=storage, compute=compute, last=last,
        )  # fmt: skip
    fallbacks = list(outcome.fallbacks)
    if isinstance(compressor, SmoothingCompressor):
        fallbacks.extend(compressor.smoother.mappings.skipped_lines())
        fallbacks.extend(compressor.smoother.unsmoothed())
    if stage.true_sequential and outcome.pipeline != SEQUENTIAL and needs_data:
        fallbacks.append(
            f"true-sequential: {outcome.pipeline} ran instead of sequential; it calibrates "
            "each target in one stage"
        )
    compressed = {layer.name for layer in compressor.results}
    if run.pruned is not None:
        compressed |= set(run.pruned.layers)
    ran = dataclasses.replace(stage, pipeline=outcome.pipeline)
    coverage = parameter_coverage(model, compressed, routers, parts)
    run.results.append(
        StageResult(ran, plan, outcome.stats, compressor.results, fallbacks, coverage)
    )


def _compressor(
    run: RunState, stage: Stage, storage: torch.dtype, *, skip: frozenset[str]
) -> LayerCompressor:
    """The callbacks that compress this stage's layers (none of ``skip``), holding an
    earlier stage's zeros; a smoothing stage's smooth them first (their pairs are found once
    the model is traced)."""
    if stage.method in SMOOTHING_METHODS:
        smoother = Smoother(
            MappingSet([], []),
            alpha=stage.smoothing_strength,
            awq_args=stage.scheme.weights if stage.scheme is not None else None,
            n_grid=stage.n_grid,
            duo_scaling=stage.duo_scaling,
        )
        return SmoothingCompressor(
            smoother, RTN if stage.method == AWQ else stage.method, stage.scheme,
            storage_dtype=storage, world=run.world, device_peaks=run.device_peaks, skip=skip,
            clip_max_shrink=stage.clip_max_shrink if stage.apply_clip else None,
        )  # fmt: skip
    return LayerCompressor(
        stage.method,
        stage.scheme,
        stage.sparsity,
        blocksize=stage.blocksize,
        percdamp=stage.percdamp,
        refine_passes=stage.refine_passes,
        storage_dtype=storage,
        world=run.world,
        device_peaks=run.device_peaks,
        keep_zeros=frozenset(run.pruned.layers) if run.pruned else frozenset(),
        skip=skip,
        expert_tokens=stage.expert_tokens,
        min_expert_tokens=stage.min_expert_tokens,
        expert_group=stage.expert_group,
    )
