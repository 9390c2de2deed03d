"""The checkpoint of a stage: calibrated through a writer that streams each finished tensor to
its place in a staging folder (with a resume point after each subgraph), renamed into place
with its recipe and report when complete."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from llmc_trace.checkpoint.writer import CheckpointWriter, assign_schemes
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.oneshot.compressor import LayerCompressor
from llmc_trace.oneshot.solve import LayerResult
from llmc_trace.oneshot.recipe import render_recipe
from llmc_trace.oneshot.report import report_files
from llmc_trace.oneshot.resume import RunResume, fingerprint
from llmc_trace.oneshot.stage import Stage
from llmc_trace.oneshot.state import RunState
from llmc_trace.pipelines.registry import PipelineOutcome
from llmc_trace.pipelines.residency import Residency, Streamed
from llmc_trace.pipelines.resume import ResumePoints

Calibrate = Callable[[Residency, ResumePoints | None], PipelineOutcome]


def calibrate_into_checkpoint(
    run: RunState,
    stage: Stage,
    model: torch.nn.Module,
    store: WeightStore,
    out: Path,
    *,
    calibrate: Calibrate,
    compressor: LayerCompressor,
    targets: list[str],
    storage: torch.dtype,
    compute: torch.dtype,
    last: bool,
) -> PipelineOutcome:
    """Run ``calibrate`` with the weights streaming from ``store`` into a checkpoint at
    ``out`` (rank 0; the other ranks drop what they finish). The last stage's checkpoint is
    quantized as its scheme says and carries the run's ``recipe.yaml`` and report; an earlier
    stage's is the dense model the next stage reads. A resumable run keeps a resume point
    after each subgraph, and continues ``run.unfinished`` when there is one
    (:mod:`~llmc_trace.oneshot.resume`)."""
    resumable = run.resumable and last
    if not run.world.is_main:
        points = None
        if resumable:
            staging = run.world.broadcast_object(None, src=0)
            points = RunResume(staging, {}, run.world, compressor, None, run.unfinished)
        outcome = calibrate(Streamed(model, store, _drop, compute), points)
        run.resume = points.stats() if points is not None else None
        return outcome
    schemes = [stage.scheme] if stage.scheme is not None and last else []
    pruned = run.pruned if last else None
    with CheckpointWriter(
        out,
        model,
        assign_schemes(model, targets, schemes) if schemes else {},
        compressor.quantized,
        dtype=storage,
        pruned=pruned.layers if pruned else (),
        max_shard_size=run.request.checkpoint.max_shard_size,
        overwrite=run.request.overwrite or not last,
        resume=run.unfinished.writer_progress() if run.unfinished is not None else None,
    ) as writer:
        points = None
        if resumable:
            run.world.broadcast_object(writer.staging, src=0)
            known = fingerprint(run.request, run.world)
            points = RunResume(writer.staging, known, run.world, compressor, writer, run.unfinished)
        residency = Streamed(model, store, writer.put, compute)
        outcome = calibrate(residency, points)
        run.resume = points.stats() if points is not None else None
        residency.finish()
        run.progress("write", 0, 1)
        recipe, files = None, {}
        if last:
            ran = dataclasses.replace(stage, pipeline=outcome.pipeline)
            stages = [*((r.stage, r.layers) for r in run.results), (ran, compressor.results)]
            run.written_report = run.report(stages, storage)
            files = report_files(run.written_report)
            recipe = run_recipe(run, [s for s, _ in stages], storage, compressor.results)
        writer.commit(
            sparsity=pruned.sparsity if pruned else None,
            recipe=recipe,
            tokenizer_dir=store.folder,
            files=files,
        )
    return outcome


def run_recipe(
    run: RunState, stages: list[Stage], dtype: torch.dtype, last_layers: list[LayerResult]
) -> str:
    """``recipe.yaml``: this run, resolved (``stages`` as they ran, the tracing ignore list
    with its fixes, ``dtype`` the checkpoint's; ``last_layers``: the last stage's results,
    not yet among the run's), as a recipe that runs it again."""
    recipe = run.request.recipe()
    recipe = dataclasses.replace(
        recipe,
        calibration=dataclasses.replace(recipe.calibration, modality=run.request.modality),
        tracing=dataclasses.replace(recipe.tracing, tracing_ignore=tuple(run.trace.ignore_list())),
        checkpoint=dataclasses.replace(recipe.checkpoint, dtype=dtype),
        stages=tuple(stages),
    )
    notes = [_notes(result.layers) for result in run.results]
    return render_recipe(recipe, fallbacks=[*notes, _notes(last_layers)])


def _notes(layers: list[LayerResult]) -> list[str]:
    """The layers compressed otherwise than their stage's method, with what was done."""
    return [f"{layer.name}: {layer.fallback}" for layer in layers if layer.fallback]


def _drop(name: str, tensor: torch.Tensor) -> None:
    """Where a rank other than 0 sends the tensors it finished: nowhere."""
