"""``compress``: calibrate a model with a planned pipeline and write a compressed-tensors checkpoint.

It reads as its steps, each in its own module: the request, validated once before heavy work
(:mod:`~llmc_trace.oneshot.request`); the model (:mod:`~llmc_trace.oneshot.load`): a skeleton
whose parameters stay on disk when a checkpoint is written (each part is read when the
pipeline runs it, and written out when it is done: host memory does not grow with the model),
loaded whole in memory otherwise; the trace (:mod:`~llmc_trace.oneshot.settle`), made once on
the first calibration batch with the fixes ``attempt --fix`` would use (proved on the tiny
twin); the memory plan (:mod:`~llmc_trace.oneshot.planning`); the pipeline, by name from
:mod:`llmc_trace.pipelines.registry` with its fallback rule (:mod:`~llmc_trace.oneshot.stage_run`,
which returns what the stage did); the checkpoint (:mod:`~llmc_trace.oneshot.sink`), streamed
into a temporary folder renamed when complete with the report and recipe built here once from
every stage's result (:mod:`~llmc_trace.oneshot.record`): an interrupted run leaves no output
under its name, at most, beside it, the resume point the same command continues from
(:mod:`~llmc_trace.oneshot.resume`).

Several stages (:class:`~llmc_trace.spec.stage.Stage`) run one after another, each a
complete calibration with its own plan and pipeline on the model as the stages before left it
(llm-compressor calls this the ``independent`` pipeline). In memory they share the loaded
model. Streamed, each stage but the last writes its model, dense, to a hidden folder beside
the output, and the next stage streams from there: disk holds one more copy of the model for
a while, host memory still one group. A quantizing stage after a pruning one keeps the mask:
the pruning stage's result names the layers, the next stage's context carries them to its
compressor, and GPTQ holds their zeros.

The model keeps the dtype its ``config.json`` declares (or the requested one): non-quantized
tensors, scales and ``config.json`` are stored in it; forward passes run in it on a GPU and on
a CPU that multiplies it in hardware, in float32 on other CPUs
(:func:`~llmc_trace.pipelines.residency.compute_dtype`); Hessians and the GPTQ/SparseGPT
arithmetic are float32 everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from llmc_trace.checkpoint.lock import output_lock
from llmc_trace.errors import BadInputError
from llmc_trace.moe import observe_experts
from llmc_trace.core.device import resolve
from llmc_trace.core.host_memory import map_large_blocks
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.core.world import World, check_shareable, current_world
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.oneshot.load import load_model, refuse_quantized, refuse_weight_changing
from llmc_trace.oneshot.record import run_recipe, run_report
from llmc_trace.oneshot.request import CompressRequest, validate
from llmc_trace.oneshot.result import CompressionResult, ResumeStats, StageResult
from llmc_trace.oneshot.resume import settle_staging
from llmc_trace.oneshot.settle import RunTrace
from llmc_trace.oneshot.sink import CheckpointSink, Sink
from llmc_trace.spec.stage import Stage
from llmc_trace.oneshot.stage_run import run_stage
from llmc_trace.oneshot.state import RunContext
from llmc_trace.report.schema import CompressionReport


def compress(
    request: CompressRequest,
    *,
    device: torch.device | None = None,
    progress: Progress | None = None,
    resume: bool = False,
    resumable: bool = True,
) -> CompressionResult:
    """Compress as ``request`` says (see :class:`CompressRequest`) and write the checkpoint;
    the request is validated first (:func:`~llmc_trace.oneshot.request.validate`).

    ``device``: where calibration runs (CUDA when there is one). Nothing is written unless
    the run completes: the checkpoint goes to a temporary folder renamed at the end. With an
    ``out_dir`` the weights stream from the source checkpoint to the new one and
    ``CompressionResult.model`` is left a skeleton; without, the model is compressed in memory.

    A run with an ``out_dir`` holds its lock for its whole length (a second run writing there
    is bad input naming this one's pid). A single-stage one keeps a resume point after each
    subgraph (unless not ``resumable``), and continues an interrupted run of the same request
    that it finds beside ``out_dir`` (:mod:`~llmc_trace.oneshot.resume`); ``resume`` demands
    one.

    >>> request = CompressRequest("tiny-llama/", dataset="calib.npy", out_dir="out/")  # doctest: +SKIP
    >>> compress(request).pipeline                                                    # doctest: +SKIP
    'sequential'
    """
    validate(request)  # the files the request names, before anything heavy
    start = time.perf_counter()
    map_large_blocks()  # freed layers return to the OS, or the resident set creeps per layer
    world = current_world()
    refuse_quantized(request.source)
    if request.needs_data:
        refuse_weight_changing(request.source)
    batches = math.ceil(request.calibration.samples / request.calibration.batch_size)
    check_shareable(world, batches, request.needs_data)
    keep_points = resumable and len(request.stages) == 1 and request.out_path is not None
    with ExitStack() as held:
        unfinished = None
        if request.out_path is not None:
            out = request.out_path
            world.agree(lambda: held.enter_context(output_lock(out)) if world.is_main else None)
            unfinished = settle_staging(request, world, resume=resume, resumable=keep_points)
        elif resume:
            raise BadInputError(
                "--resume continues a run writing a checkpoint, and this one has no --out.",
                hint="Give the interrupted run's --out.",
                param="resume",
            )
        context = RunContext(
            request,
            resolve(device or world.device),  # indexed, so "already there" compares exactly
            (progress or no_progress) if world.is_main else no_progress,
            world,
            RunTrace(request.source, request.tracing, request.modality),
            resumable=keep_points,
            unfinished=unfinished,
        )
        ran = _stages(context, request.stages)
    assert context.trace.traced is not None
    return CompressionResult(
        request.out_path,
        ran.model,
        ran.results,
        context.trace.ignore_list(),
        time.perf_counter() - start,
        context.trace.traced,
        ran.report,
        context.calibration.notes if context.calibration is not None else (),
        ran.resume,
    )


@dataclass(frozen=True)
class _Ran:
    """What the stages left: the model, each stage's result, the run's report, and the
    last stage's resume points."""

    model: torch.nn.Module
    results: list[StageResult]
    report: CompressionReport
    resume: ResumeStats | None


def _stages(context: RunContext, stages: tuple[Stage, ...]) -> _Ran:
    """Run every stage, each but the last into a hidden folder the next reads, each with the
    mask the one before it left; the last commits the checkpoint with the run's report and
    recipe, built here once from every stage's result."""
    request, world = context.request, context.world
    results: list[StageResult] = []
    model: torch.nn.Module | None = None
    with _intermediate_folders(request.out_path, len(stages) - 1, world) as folders:
        source = request.source
        if request.out_path is None:
            model = _load(context, source, None)
        for index, stage in enumerate(stages):
            last = index == len(stages) - 1
            out = request.out_path if last or not folders else folders[index]
            context.progress("load", 0, 1)
            with _sink(context, source, out, last) as sink:
                if sink.store is not None:
                    model = _load(context, source, sink.store)
                assert model is not None
                with observe_experts(model):
                    results.append(run_stage(context, stage, model, sink))
                dtype = parameter_dtype(model)
                assert dtype is not None  # loading refuses a model without floating-point weights
                report = run_report(context, results, dtype) if last else None
                sink.commit(report, run_recipe(context, results, dtype) if last else None)
            world.barrier()  # the next stage reads what rank 0 wrote; the run ends together
            context = dataclasses.replace(context, pruned=results[-1].pruned)
            if not last and out is not None:
                source = resolve_model(str(out))
    assert model is not None and report is not None
    return _Ran(model, results, report, sink.resume)


def _sink(context: RunContext, source: ModelSource, out: Path | None, last: bool) -> Sink:
    """Where a stage's weights go: streamed from ``source`` into ``out``, or kept in memory."""
    if out is None:
        return Sink()
    assert source.folder is not None  # a request has weights
    return CheckpointSink(context, WeightStore(source.folder), out, last=last)


def _load(context: RunContext, source: ModelSource, store: WeightStore | None) -> torch.nn.Module:
    request = context.request
    return load_model(
        source,
        store,
        attn_implementation=request.calibration.attn_implementation,
        dtype=request.checkpoint.dtype,
    )


@contextmanager
def _intermediate_folders(out: Path | None, count: int, world: World) -> Iterator[list[Path]]:
    """Hidden folders beside the output for the stages before the last (removed at the end,
    finished or not); none when compressing in memory."""
    if out is None or count == 0:
        yield []
        return
    tag = world.broadcast_object(uuid.uuid4().hex[:8], src=0)  # one name on every rank
    folders = [out.parent / f".{out.name}.stage{i + 1}.{tag}" for i in range(count)]
    try:
        yield folders
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
