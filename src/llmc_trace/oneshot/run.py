"""``compress``: calibrate a model with a planned pipeline and write a compressed-tensors checkpoint.

It reads as its steps: the request, validated once before heavy work; the model: a skeleton
whose parameters stay on disk when a checkpoint is written (each part is read when the
pipeline runs it, and written out when it is done: host memory does not grow with the model),
loaded whole in memory otherwise; the traced model, traced once per stage on the first
calibration batch with the fixes ``attempt --fix`` would use (proved on the tiny twin); the
memory plan from that trace; the pipeline, by name from :mod:`llmc_trace.pipelines.registry`
with its fallback rule; the checkpoint, streamed into a temporary folder renamed when complete
(an interrupted run leaves no output).

Several stages (:class:`~llmc_trace.oneshot.stage.Stage`) run one after another, each a
complete calibration with its own plan and pipeline on the model as the stages before left it
(llm-compressor calls this the ``independent`` pipeline). In memory they share the loaded
model. Streamed, each stage but the last writes its model, dense, to a hidden folder beside
the output, and the next stage streams from there: disk holds one more copy of the model for
a while, host memory still one group. A quantizing stage after a pruning one keeps the mask:
the compressor is told which layers were pruned, and GPTQ holds their zeros.

The model keeps the dtype its ``config.json`` declares (or the requested one): non-quantized
tensors, scales and ``config.json`` are stored in it; forward passes run in it on a GPU and in
float32 on a CPU (:func:`~llmc_trace.pipelines.residency.compute_dtype`); Hessians and the
GPTQ/SparseGPT arithmetic are float32 everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmc_trace.attempt.run import settle
from llmc_trace.checkpoint.writer import CheckpointWriter, assign_schemes
from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.core.experts import fused_experts, observe_experts, router_layers
from llmc_trace.core.device_peak import DevicePeaks
from llmc_trace.core.host_memory import map_large_blocks
from llmc_trace.core.names import AUTO, DATA_METHODS, INDEPENDENT, SEQUENTIAL
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.core.world import World, check_shareable, current_world
from llmc_trace.data import CalibrationSet, load_calibration
from llmc_trace.errors import BadInputError
from llmc_trace.models.build import build_meta_model, build_skeleton, load_pretrained
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.oneshot.compressor import LayerCompressor, LayerResult
from llmc_trace.oneshot.coverage import KindCoverage, parameter_coverage
from llmc_trace.oneshot.recipe import render_recipe
from llmc_trace.oneshot.report import build_report, report_files
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.stage import Stage
from llmc_trace.pipelines.registry import Calibration, fallback_order, run_pipelines
from llmc_trace.pipelines.residency import InMemory, Residency, Streamed, compute_dtype
from llmc_trace.pipelines.sequential import PipelineStats
from llmc_trace.plan import MemoryPlan, RunSettings, plan_memory
from llmc_trace.report.schema import CompressionReport
from llmc_trace.traced.model import TracedModel, display_name, trace_model
from llmc_trace.traced.twin import TwinCheck, verify_on_twin
from llmc_trace.tracing.definitions import definition_entry, definitions_for, weight_changing
from llmc_trace.tracing.options import TracingOptions


@dataclass(frozen=True)
class StageResult:
    """What one stage did: the stage as it ran (its ``pipeline`` the one that ran), its plan,
    the pipeline's statistics, the compressed layers, and any fallback taken."""

    stage: Stage
    plan: MemoryPlan
    stats: PipelineStats
    layers: list[LayerResult]
    fallbacks: list[str]
    #: weights compressed and left, by kind of layer (experts one by one)
    coverage: list[KindCoverage] = field(default_factory=list)

    @property
    def pipeline(self) -> str:
        return self.stage.pipeline


@dataclass(frozen=True)
class CompressionResult:
    """What ``compress`` did and where the checkpoint is. ``pipeline`` is the one that ran, or
    ``independent`` for several stages (each stage's is in ``stages``); ``plan``, ``stats``
    and ``layers`` are the last stage's (the one the checkpoint's integers come from).
    ``report``: every stage's layers as the checkpoint's ``report.json`` holds them."""

    out_dir: Path | None
    #: the compressed model in memory; a skeleton on ``meta`` when it was streamed to out_dir
    model: torch.nn.Module = field(repr=False)
    stages: list[StageResult]
    ignore: list[str]
    elapsed_s: float
    traced: TracedModel = field(repr=False)
    report: CompressionReport = field(repr=False)

    @property
    def pipeline(self) -> str:
        return self.stages[0].pipeline if len(self.stages) == 1 else INDEPENDENT

    @property
    def plan(self) -> MemoryPlan:
        return self.stages[-1].plan

    @property
    def stats(self) -> PipelineStats:
        return self.stages[-1].stats

    @property
    def layers(self) -> list[LayerResult]:
        return self.stages[-1].layers

    @property
    def fallbacks(self) -> list[str]:
        return [fallback for stage in self.stages for fallback in stage.fallbacks]


@dataclass
class _Pruned:
    """The mask an earlier stage left: which layers, to what structure."""

    sparsity: Sparsity
    layers: list[str]


def compress(
    request: CompressRequest,
    *,
    device: torch.device | None = None,
    progress: Progress | None = None,
) -> CompressionResult:
    """Compress as ``request`` says (see :class:`CompressRequest`) and write the checkpoint.

    ``device``: where calibration runs (CUDA when there is one). Nothing is written unless
    the run completes: the checkpoint goes to a temporary folder renamed at the end. With an
    ``out_dir`` the weights stream from the source checkpoint to the new one and
    ``CompressionResult.model`` is left a skeleton; without, the model is compressed in memory.

    >>> request = CompressRequest("tiny-llama/", dataset="calib.npy", out_dir="out/")  # doctest: +SKIP
    >>> compress(request).pipeline                                                    # doctest: +SKIP
    'sequential'
    """
    start = time.perf_counter()
    map_large_blocks()  # freed layers return to the OS, or the resident set creeps per layer
    world = current_world()
    report = (progress or no_progress) if world.is_main else no_progress
    if request.needs_data:
        refuse_weight_changing(request.source)
    check_shareable(world, math.ceil(request.samples / request.batch_size), request.needs_data)
    device = device or world.device
    stages = list(request.stages or ())
    run = _Run(request, device, report, world)
    with run.intermediate_folders(len(stages) - 1) as folders:
        source = request.source
        model = None if request.out_path is not None else run.load(source, None)
        for index, stage in enumerate(stages):
            last = index == len(stages) - 1
            out = request.out_path if last or not folders else folders[index]
            if out is not None:
                model = None  # each streamed stage reads the one before from disk
            model = run.stage(stage, source, model, out, last=last)
            if not last and out is not None:
                source = resolve_model(str(out))
    assert model is not None and run.traced is not None
    report = run.written_report or run.build_report(
        [(result.stage, result.layers) for result in run.results], parameter_dtype(model)
    )
    return CompressionResult(
        request.out_path,
        model,
        run.results,
        run.traced.options.ignore_list(),
        time.perf_counter() - start,
        run.traced,
        report,
    )


class _Run:
    """The state the stages of one run share: the calibration set, the tracing options once
    settled, the mask of a pruning stage, and each stage's result."""

    def __init__(
        self, request: CompressRequest, device: torch.device, report: Progress, world: World
    ) -> None:
        self.request = request
        self.world = world
        self.device = device
        self.report = report
        self.calibration: CalibrationSet | None = None
        self.options: TracingOptions | None = None
        self.traced: TracedModel | None = None
        self.check: TwinCheck | None = None
        self.pruned: _Pruned | None = None
        self.results: list[StageResult] = []
        self.device_peaks = DevicePeaks()
        self.written_report: CompressionReport | None = None

    @contextmanager
    def intermediate_folders(self, count: int) -> Iterator[list[Path]]:
        """Hidden folders beside the output for the stages before the last (removed at the
        end, finished or not); none when compressing in memory."""
        out = self.request.out_path
        if out is None or count == 0:
            yield []
            return
        tag = self.world.broadcast_object(uuid.uuid4().hex[:8], src=0)  # one name on every rank
        folders = [out.parent / f".{out.name}.stage{i + 1}.{tag}" for i in range(count)]
        try:
            yield folders
        finally:
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)

    def load(self, source: ModelSource, store: WeightStore | None) -> torch.nn.Module:
        """The model (its skeleton, to fill from ``store``, when there is one) in the requested
        dtype, with the requested attention kernel, or eager where the architecture lacks it."""
        request = self.request

        def load(kernel: str) -> torch.nn.Module:
            if store is not None:
                return build_skeleton(source, store, kernel, request.dtype)
            return load_pretrained(source, kernel, request.dtype)

        try:
            return load(request.attn_implementation)
        except ValueError:
            if request.attn_implementation == "eager":
                raise
            return load("eager")

    def stage(
        self,
        stage: Stage,
        source: ModelSource,
        model: torch.nn.Module | None,
        out: Path | None,
        *,
        last: bool,
    ) -> torch.nn.Module:
        """Run ``stage`` on ``model`` (loaded), or on ``source`` streamed into ``out``."""
        self.report("load", 0, 1)
        assert source.folder is not None  # a request has weights
        store = WeightStore(source.folder) if out is not None else None
        if model is None:
            model = self.load(source, store)
        with observe_experts(model):
            self._stage(stage, source, model, store, out, last=last)
        self.world.barrier()  # the next stage reads what rank 0 wrote; the run ends together
        return model

    def _stage(
        self,
        stage: Stage,
        source: ModelSource,
        model: torch.nn.Module,
        store: WeightStore | None,
        out: Path | None,
        *,
        last: bool,
    ) -> None:
        """:meth:`stage` with every fused expert visible as its own projections."""
        request, report = self.request, self.report
        storage = parameter_dtype(model)
        assert storage is not None  # loading refuses a model without floating-point weights
        calibration = self._calibration(model)
        compressor = LayerCompressor(
            stage.method,
            stage.scheme,
            stage.sparsity,
            blocksize=stage.blocksize,
            percdamp=stage.percdamp,
            refine_passes=stage.refine_passes,
            storage_dtype=storage,
            world=self.world,
            device_peaks=self.device_peaks,
            keep_zeros=frozenset(self.pruned.layers) if self.pruned else frozenset(),
            skip=frozenset(routers := router_layers(model)),
            expert_tokens=stage.expert_tokens,
            min_expert_tokens=stage.min_expert_tokens,
            expert_group=stage.expert_group,
        )
        targets = _check_targets(model, compressor, request.source.name)
        report("trace", 0, 1)
        needs_data = stage.method in DATA_METHODS
        traced, check = self._trace(model, calibration.batches[0], needs_data)
        compute = compute_dtype(storage, device=self.device)
        settings = RunSettings(  # per rank: each caches and calibrates its share of the rows
            math.ceil(request.samples / self.world.size),
            request.seq_len,
            request.batch_size,
            dtype_bytes=compute.itemsize,
            storage_bytes=storage.itemsize,
            needs_data=needs_data,
            kept_bytes_per_weight=1.0 if stage.quantizes else 0.0,
            streamed=store is not None,
            device_is_host=self.device.type == "cpu",
            expert_group=stage.expert_group,
        )
        plan = plan_memory(traced, settings, twin=check.twin if check else None)
        if not plan.fits and stage.expert_group is None and needs_data and fused_experts(model):
            bounded = _bounded_experts(traced, settings, check)
            if bounded is not None:
                plan, group = bounded
                stage = dataclasses.replace(stage, expert_group=group)
                compressor.expert_group = group
        order = fallback_order(
            plan.chosen if stage.pipeline == AUTO else stage.pipeline, plan.pipelines()
        )

        def calibrate(residency: Residency) -> Any:
            return run_pipelines(
                order,
                Calibration(
                    traced,
                    self.world.shard(calibration.batches),
                    compressor,
                    self.device,
                    propagate_error=stage.propagate_error,
                    true_sequential=stage.true_sequential,
                    progress=report,
                    residency=residency,
                    twin=check.twin if check else None,
                ),
            )

        if stage.prunes:
            self.pruned = _Pruned(stage.sparsity, targets)  # type: ignore[arg-type]
        if out is None:
            outcome = calibrate(InMemory(torch.device("cpu"), compute))
        elif not self.world.is_main:  # rank 0 writes; the others read and drop what they finish
            outcome = calibrate(Streamed(model, store, _drop, compute))  # type: ignore[arg-type]
        else:
            assert source.folder is not None
            schemes = [stage.scheme] if stage.scheme is not None and last else []
            pruned = self.pruned if last else None
            with CheckpointWriter(
                out,
                model,
                assign_schemes(model, targets, schemes) if schemes else {},
                compressor.quantized,
                dtype=storage,
                pruned=pruned.layers if pruned else (),
                max_shard_size=request.max_shard_size,
                overwrite=request.overwrite or not last,
            ) as writer:
                residency = Streamed(model, store, writer.put, compute)  # type: ignore[arg-type]
                outcome = calibrate(residency)
                residency.finish()
                report("write", 0, 1)
                ran = dataclasses.replace(stage, pipeline=outcome.pipeline)
                files = {}
                if last:
                    done = [(r.stage, r.layers) for r in self.results]
                    self.written_report = self.build_report(
                        [*done, (ran, compressor.results)], storage
                    )
                    files = report_files(self.written_report)
                writer.commit(
                    sparsity=pruned.sparsity if pruned else None,
                    recipe=self._recipe(
                        [*(r.stage for r in self.results), ran],
                        storage,
                        [*(_notes(r.layers) for r in self.results), _notes(compressor.results)],
                    )
                    if last
                    else None,
                    tokenizer_dir=source.folder,
                    files=files,
                )
        fallbacks = list(outcome.fallbacks)
        if stage.true_sequential and outcome.pipeline != SEQUENTIAL and needs_data:
            fallbacks.append(
                f"true-sequential: {outcome.pipeline} ran instead of sequential; it calibrates "
                "each target in one stage"
            )
        ran = dataclasses.replace(stage, pipeline=outcome.pipeline)
        compressed = {layer.name for layer in compressor.results}
        if self.pruned is not None:
            compressed |= set(self.pruned.layers)
        coverage = parameter_coverage(model, compressed, routers)
        self.results.append(
            StageResult(ran, plan, outcome.stats, compressor.results, fallbacks, coverage)
        )

    def build_report(
        self, stages: list[tuple[Stage, list[LayerResult]]], dtype: torch.dtype | None
    ) -> CompressionReport:
        """The report of ``stages`` as they ran, with their compressed layers."""
        assert dtype is not None  # loading refuses a model without floating-point weights
        return build_report(
            self.request,
            stages,
            self.traced,
            device=self.device,
            dtype=dtype,
            device_peak_bytes=self.device_peaks.current(self.device),
        )

    def _calibration(self, model: torch.nn.Module) -> CalibrationSet:
        """The calibration rows, loaded once for every stage (token ids need no tokenizer:
        they are checked against the embedding table instead)."""
        if self.calibration is None:
            request = self.request
            self.calibration = load_calibration(
                request.dataset,
                _tokenizer(request.source) if request.data_kind != "npy" else None,
                samples=request.samples,
                seq_len=request.seq_len,
                seed=request.seed,
                batch_size=request.batch_size,
                vocab_size=model.get_input_embeddings().num_embeddings,
            )
        return self.calibration

    def _trace(
        self, model: torch.nn.Module, batch: dict[str, Any], needs_data: bool
    ) -> tuple[TracedModel, TwinCheck | None]:
        """Trace this stage's model with the options the first stage settled on; in memory,
        stages share one model object, and the trace (and its proof) made for an earlier
        stage holds for the later ones: only the weights changed."""
        request = self.request
        if self.traced is not None and self.traced.model is model:
            if self.check is not None or not needs_data:
                return self.traced, self.check
        if self.options is None:
            self.options = TracingOptions.parse(
                model, request.ignore, request.sequential_targets, request.targets_per_subgraph
            )
        traced, check = trace_for_calibration(
            request.source, model, batch, self.options, needs_data=needs_data
        )
        self.options, self.traced, self.check = traced.options, traced, check
        return traced, check

    def _recipe(self, stages: list[Stage], dtype: torch.dtype, notes: list[list[str]]) -> str:
        """``recipe.yaml``: this run, resolved (``dtype``: the checkpoint's), as a recipe that
        runs it again."""
        request = self.request
        assert self.options is not None
        arguments = {
            "dataset": str(request.dataset),
            "samples": request.samples,
            "seq_len": request.seq_len,
            "batch_size": request.batch_size,
            "seed": request.seed,
            "attn_implementation": request.attn_implementation,
            "sequential_targets": request.sequential_targets,
            "targets_per_subgraph": request.targets_per_subgraph,
            "dtype": dtype,
            "max_shard_size": request.max_shard_size,
        }
        return render_recipe(arguments, stages, ignore=self.options.ignore_list(), fallbacks=notes)


def trace_for_calibration(
    source: ModelSource,
    model: torch.nn.Module,
    batch: dict[str, Any],
    options: TracingOptions,
    *,
    needs_data: bool,
) -> tuple[TracedModel, TwinCheck | None]:
    """Trace ``model`` once on the first calibration batch, fixed as ``attempt --fix`` would.

    For methods that calibrate on data the trace is proved on the tiny twin, and a failure
    starts the fix search; a fix that does not verify is not used, and a model that does not
    trace still calibrates through a pipeline that needs no trace (the plan leaves
    sequential out).
    """
    traced = trace_model(model, batch, options, name=display_name(source), source=source)
    if not needs_data:
        return traced, None
    ids = batch["input_ids"]
    sample = SampleOptions(seq_len=int(ids.shape[1]), batch_size=int(ids.shape[0]))
    settled = settle(traced, lambda candidate: verify_on_twin(candidate, "text", sample), fix=True)
    return settled.fixed.traced, settled.fixed.check


def _bounded_experts(
    traced: TracedModel, settings: RunSettings, check: TwinCheck | None
) -> tuple[MemoryPlan, int] | None:
    """The plan with the largest expert group (halving from 64) that makes a plan that did
    not fit fit, or ``None`` when no group does (the experts' Hessians were not the cause)."""
    group = 64
    while group >= 1:
        bounded = dataclasses.replace(settings, expert_group=group)
        plan = plan_memory(traced, bounded, twin=check.twin if check else None)
        if plan.fits:
            return plan, group
        group //= 2
    return None


def _notes(layers: list[LayerResult]) -> list[str]:
    """The layers compressed otherwise than their stage's method, with what was done."""
    return [f"{layer.name}: {layer.fallback}" for layer in layers if layer.fallback]


def _drop(name: str, tensor: torch.Tensor) -> None:
    """Where a rank other than 0 sends the tensors it finished: nowhere."""


def refuse_weight_changing(source: ModelSource) -> None:
    """A model whose only traceable form changes its weights cannot be compressed (checked on
    ``meta``, before anything heavy loads)."""
    classes = definitions_for(build_meta_model(source))
    changing = weight_changing([definition_entry(name) for name in classes])
    if changing:
        raise BadInputError(
            f"{source.name} traces only through the definition of {', '.join(changing)} in "
            "tracing_models/, which changes the model's weights in place before calibration "
            "(it declares changes_weights); the checkpoint would store the changed weights, and "
            "loading would change them again.",
            hint="Compress another architecture; llmc-trace attempt still traces and verifies it.",
            param="model",
        )


def _check_targets(model: torch.nn.Module, compressor: LayerCompressor, name: str) -> list[str]:
    """The paths of the targeted layers: something must be targeted, and every group must
    fit its layer, before calibration."""
    targets = compressor.targets(list(model.named_modules()))
    if not targets:
        raise BadInputError(
            f"no layer of {name} is targeted by the scheme.",
            hint="Check the scheme's targets and ignore patterns.",
            param="scheme",
        )
    args = compressor.scheme.weights if compressor.scheme is not None else None
    if args is not None and args.strategy == "group" and args.group_size:
        misfits = [n for n, layer in targets if layer.in_features % args.group_size]
        if misfits:
            raise BadInputError(
                f"{len(misfits)} targeted layers (e.g. {misfits[0]}) have an input width that is "
                f"not a multiple of the group size {args.group_size}.",
                hint="Use a per-channel scheme or a smaller group size, or ignore those layers.",
                param="scheme",
            )
    return [n for n, _ in targets]


def _tokenizer(source: ModelSource) -> Any:
    if not source.has_tokenizer:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.folder)
