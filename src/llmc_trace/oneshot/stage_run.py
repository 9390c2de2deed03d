"""One stage of a run, as its steps: trace, plan, compressor, calibrate into the sink, result."""

from __future__ import annotations

import dataclasses

import torch

from llmc_trace.core.memory_limit import memory_limit
from llmc_trace.core.names import AUTO, AWQ, CALIBRATED_METHODS, RTN, SEQUENTIAL, SMOOTHING_METHODS
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.graph.literals import META, retarget_literals
from llmc_trace.models.parts import ModelParts, model_parts
from llmc_trace.moe import router_layers
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.oneshot.weight_coverage import parameter_coverage
from llmc_trace.oneshot.pairs import stage_mappings
from llmc_trace.oneshot.planning import check_memory_limit, plan_stage
from llmc_trace.oneshot.result import Pruned, StageResult
from llmc_trace.oneshot.sink import Sink
from llmc_trace.oneshot.smoothing import Smoother, SmoothingCompressor
from llmc_trace.spec.stage import Stage
from llmc_trace.oneshot.state import RunContext
from llmc_trace.oneshot.target_checks import (
    check_ignore,
    check_model_options,
    check_targets,
    keep_served_layers_whole,
)
from llmc_trace.pipelines.calibration import Calibration
from llmc_trace.pipelines.registry import PipelineOutcome, fallback_order, run_pipelines
from llmc_trace.pipelines.residency import compute_dtype
from llmc_trace.plan import MemoryPlan
from llmc_trace.traced.mappings import MappingSet


def run_stage(context: RunContext, stage: Stage, model: torch.nn.Module, sink: Sink) -> StageResult:
    """Compress ``model`` as ``stage`` says (every fused expert already visible as its own
    projections), its weights going to ``sink``; what the stage did."""
    storage = parameter_dtype(model)
    assert storage is not None  # loading refuses a model without floating-point weights
    batches = context.calibration_set(model).batches
    routers, parts = router_layers(model), model_parts(model)
    check_model_options(model, stage, context.request.source.name, routers, parts)
    check_ignore(model, stage)
    stage = keep_served_layers_whole(model, stage)
    context.progress("trace", 0, 1)
    needs_data = stage.method in CALIBRATED_METHODS
    traced, check = context.trace.trace(model, batches[0], needs_data=needs_data)
    compute = compute_dtype(storage, device=context.device)
    subgraphs = traced.subgraphs if traced.traced else []
    retarget_literals(subgraphs, storage, compute)
    retarget_literals(subgraphs, META, context.device)  # a skeleton's `self.device`, streamed
    plan, stage = plan_stage(
        traced, check, stage, context.request.calibration, ranks=context.world.size,
        storage=storage, compute=compute, streamed=sink.store is not None, device=context.device,
    )  # fmt: skip
    check_memory_limit(plan, stage.pipeline, memory_limit())
    compressor = _compressor(context, stage, storage, _dense(stage, model, routers, parts))
    targets = check_targets(
        model,
        compressor,
        context.request.source.name,
        group_size_given=stage.group_size is not None,
        ignore_given=bool(stage.ignore),
    )
    if isinstance(compressor, SmoothingCompressor):
        compressor.smoother.mappings = stage_mappings(context, model, batches[0], compressor)
    pruned = Pruned(stage.sparsity, targets) if stage.prunes else context.pruned
    residency, points = sink.open(
        model, stage, compressor, targets, pruned, storage=storage, compute=compute
    )
    calibration = Calibration(
        traced, context.world.shard(batches), compressor, context.device,
        propagate_error=stage.propagate, true_sequential=stage.true_sequential,
        progress=context.progress, residency=residency, twin=check.twin if check else None,
        resume=points,
    )  # fmt: skip
    outcome = run_pipelines(_order(context, stage, plan), calibration)
    sink.finish(residency)
    compressed = {layer.name for layer in compressor.results} | set(pruned.layers if pruned else ())
    ran = dataclasses.replace(stage, pipeline=outcome.pipeline)
    fallbacks = _fallbacks(stage, compressor, outcome, needs_data=needs_data)
    coverage = parameter_coverage(model, compressed, routers, parts)
    return StageResult(ran, plan, outcome.stats, compressor.results, fallbacks, coverage, pruned)


def _dense(
    stage: Stage, model: torch.nn.Module, routers: list[str], parts: ModelParts
) -> frozenset[str]:
    """The layers a stage leaves dense whatever its scheme: the routers, and a multimodal
    model's towers unless the stage compresses them."""
    towers = [] if stage.towers else parts.in_towers(n for n, _ in model.named_modules())
    return frozenset((*routers, *towers))


def _order(context: RunContext, stage: Stage, plan: MemoryPlan) -> list[str]:
    """The pipelines to try, in order: the chosen one, then its fallbacks; an interrupted
    run's alone (its resume point holds that pipeline's tensors)."""
    if context.unfinished is not None:
        return [context.unfinished.pipeline]
    return fallback_order(
        plan.chosen if stage.pipeline == AUTO else stage.pipeline, plan.pipelines()
    )


def _fallbacks(
    stage: Stage, compressor: LayerCompressor, outcome: PipelineOutcome, *, needs_data: bool
) -> list[str]:
    """Everything the stage did otherwise than asked, one line each."""
    fallbacks = list(outcome.fallbacks)
    if isinstance(compressor, SmoothingCompressor):
        fallbacks.extend(compressor.smoother.mappings.skipped_lines())
        fallbacks.extend(compressor.smoother.unsmoothed())
    if stage.true_sequential and outcome.pipeline != SEQUENTIAL and needs_data:
        fallbacks.append(
            f"true-sequential: {outcome.pipeline} ran instead of sequential; it calibrates "
            "each target in one stage"
        )
    return fallbacks


def _compressor(
    context: RunContext, stage: Stage, storage: torch.dtype, skip: frozenset[str]
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
            storage_dtype=storage, world=context.world, device_peaks=context.device_peaks,
            skip=skip,
            clip_max_shrink=stage.clip_max_shrink if stage.apply_clip else None,
        )  # fmt: skip
    return LayerCompressor(
        stage.method,
        stage.scheme,
        stage.sparsity,
        stage.solver,
        storage_dtype=storage,
        world=context.world,
        device_peaks=context.device_peaks,
        keep_zeros=frozenset(context.pruned.layers) if context.pruned else frozenset(),
        skip=skip,
        expert_tokens=stage.expert_tokens,
        min_expert_tokens=stage.min_expert_tokens,
        expert_group=stage.expert_group,
    )
