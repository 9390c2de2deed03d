"""``compress``: calibrate a model with a planned pipeline and write a compressed-tensors checkpoint.

It reads as its steps: the request, validated once before heavy work; the model: a skeleton
whose parameters stay on disk when a checkpoint is written (each part is read when the
pipeline runs it, and written out when it is done: host memory does not grow with the model),
loaded whole in memory otherwise; the traced model, traced once on the first calibration batch
with the fixes ``attempt --fix`` would use (proved on the tiny twin); the memory plan from
that trace; the pipeline, by name from :mod:`llmc_trace.pipelines.registry` with its fallback
rule; the checkpoint, streamed into a temporary folder renamed when complete (an interrupted
run leaves no output).

The model keeps the dtype its ``config.json`` declares (or the requested one): non-quantized
tensors, scales and ``config.json`` are stored in it; forward passes run in it on a GPU and in
float32 on a CPU (:func:`~llmc_trace.pipelines.residency.compute_dtype`); Hessians and the
GPTQ/SparseGPT arithmetic are float32 everywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmc_trace.attempt.run import settle
from llmc_trace.checkpoint.recipe import Recipe
from llmc_trace.checkpoint.writer import CheckpointWriter, assign_schemes
from llmc_trace.core.names import AUTO, GPTQ, SEQUENTIAL
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.core.host_memory import map_large_blocks
from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.data import load_calibration
from llmc_trace.errors import BadInputError
from llmc_trace.models.build import build_meta_model, build_skeleton, load_pretrained
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.source import ModelSource
from llmc_trace.oneshot.compressor import LayerCompressor, LayerResult
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.pipelines.registry import (
    Calibration,
    PipelineOutcome,
    fallback_order,
    run_pipelines,
)
from llmc_trace.pipelines.residency import InMemory, Residency, Streamed, compute_dtype
from llmc_trace.pipelines.sequential import PipelineStats
from llmc_trace.plan import MemoryPlan, RunSettings, plan_memory
from llmc_trace.traced.model import TracedModel, display_name, trace_model
from llmc_trace.traced.twin import TwinCheck, verify_on_twin
from llmc_trace.tracing.definitions import definition_entry, definitions_for, weight_changing
from llmc_trace.tracing.options import TracingOptions


@dataclass(frozen=True)
class CompressionResult:
    """What ``compress`` did and where the checkpoint is."""

    out_dir: Path | None
    #: the compressed model in memory; a skeleton on ``meta`` when it was streamed to out_dir
    model: torch.nn.Module = field(repr=False)
    pipeline: str
    plan: MemoryPlan
    stats: PipelineStats
    layers: list[LayerResult]
    ignore: list[str]
    elapsed_s: float
    fallbacks: list[str]
    traced: TracedModel = field(repr=False)


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
    report = progress or no_progress
    if request.needs_data:
        refuse_weight_changing(request.source)
    report("load", 0, 1)
    assert request.source.folder is not None  # a request has weights
    store = WeightStore(request.source.folder) if request.out_path is not None else None
    loaded = _load(request, store)
    storage = parameter_dtype(loaded)
    assert storage is not None  # loading refuses a model without floating-point weights
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # token ids need no tokenizer (checked against the embedding table instead); the
    # checkpoint copies the tokenizer's files either way
    calibration = load_calibration(
        request.dataset,
        _tokenizer(request.source) if request.data_kind != "npy" else None,
        samples=request.samples,
        seq_len=request.seq_len,
        seed=request.seed,
        batch_size=request.batch_size,
        vocab_size=loaded.get_input_embeddings().num_embeddings,
    )
    compressor = LayerCompressor(
        request.method,
        request.quantization,
        request.target_sparsity,
        refine_passes=request.refine_passes,
        storage_dtype=storage,
    )
    targets = _check_targets(loaded, compressor, request.source.name)
    report("trace", 0, 1)
    traced, check = trace_for_calibration(request, loaded, calibration.batches[0])
    compute = compute_dtype(storage, device)
    settings = RunSettings(
        request.samples,
        request.seq_len,
        request.batch_size,
        dtype_bytes=compute.itemsize,
        storage_bytes=storage.itemsize,
        needs_data=request.needs_data,
        kept_bytes_per_weight=0.0 if request.quantization is None else 1.0,
        streamed=store is not None,
        device_is_host=device.type == "cpu",
    )
    plan = plan_memory(traced, settings, twin=check.twin if check else None)
    chosen = plan.chosen if request.pipeline == AUTO else request.pipeline
    order = fallback_order(chosen, plan.pipelines())

    def calibrate(residency: Residency) -> PipelineOutcome:
        return run_pipelines(
            order,
            Calibration(
                traced,
                calibration.batches,
                compressor,
                device,
                propagate_error=request.propagate_error,
                true_sequential=request.true_sequential,
                progress=report,
                residency=residency,
                twin=check.twin if check else None,
            ),
        )

    if store is None:
        outcome = calibrate(InMemory(torch.device("cpu"), compute))
    else:
        assert request.out_path is not None
        schemes = [request.quantization] if request.quantization else []
        with CheckpointWriter(
            request.out_path,
            loaded,
            assign_schemes(loaded, targets, schemes) if schemes else {},
            compressor.quantized,
            dtype=storage,
            pruned=targets if request.target_sparsity is not None else (),
            max_shard_size=request.max_shard_size,
            overwrite=request.overwrite,
        ) as writer:
            residency = Streamed(loaded, store, writer.put, compute)
            outcome = calibrate(residency)
            residency.finish()
            report("write", 0, 1)
            writer.commit(
                sparsity=request.target_sparsity,
                recipe=_recipe(
                    request, outcome.pipeline, calibration.num_samples, compressor, loaded
                ),
                tokenizer_dir=request.source.folder,
            )
    fallbacks = list(outcome.fallbacks)
    if request.true_sequential and outcome.pipeline != SEQUENTIAL and request.needs_data:
        fallbacks.append(
            f"true-sequential: {outcome.pipeline} ran instead of sequential; it calibrates each "
            "target in one stage"
        )
    return CompressionResult(
        request.out_path,
        loaded,
        outcome.pipeline,
        plan,
        outcome.stats,
        compressor.results,
        traced.options.ignore_list(),
        time.perf_counter() - start,
        fallbacks,
        traced,
    )


def trace_for_calibration(
    request: CompressRequest, model: torch.nn.Module, batch: dict[str, Any]
) -> tuple[TracedModel, TwinCheck | None]:
    """Trace ``model`` once on the first calibration batch, fixed as ``attempt --fix`` would.

    For methods that calibrate on data the trace is proved on the tiny twin, and a failure
    starts the fix search; a fix that does not verify is not used, and a model that does not
    trace still calibrates through a pipeline that needs no trace (the plan leaves
    sequential out).
    """
    name = display_name(request.source)
    traced = trace_model(model, batch, TracingOptions(), name=name, source=request.source)
    if not request.needs_data:
        return traced, None
    ids = batch["input_ids"]
    options = SampleOptions(seq_len=int(ids.shape[1]), batch_size=int(ids.shape[0]))
    settled = settle(traced, lambda candidate: verify_on_twin(candidate, "text", options), fix=True)
    return settled.fixed.traced, settled.fixed.check


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


def _load(request: CompressRequest, store: WeightStore | None) -> torch.nn.Module:
    """The model (its skeleton, to fill from ``store``, when there is one) in the requested
    dtype, with the requested attention kernel, or eager where the architecture lacks it."""

    def load(kernel: str) -> torch.nn.Module:
        if store is not None:
            return build_skeleton(request.source, store, kernel, request.dtype)
        return load_pretrained(request.source, kernel, request.dtype)

    try:
        return load(request.attn_implementation)
    except ValueError:
        if request.attn_implementation == "eager":
            raise
        return load("eager")


def _recipe(
    request: CompressRequest,
    pipeline: str,
    num_samples: int,
    compressor: LayerCompressor,
    model: torch.nn.Module,
) -> Recipe:
    """What ran, for ``recipe.yaml``; calibration facts only where the method calibrates."""
    if not request.needs_data:
        return Recipe(request.method, pipeline=pipeline, seed=request.seed)
    return Recipe(
        request.method,
        num_samples=num_samples,
        seq_len=request.seq_len,
        pipeline=pipeline,
        seed=request.seed,
        percdamp=compressor.percdamp,
        blocksize=compressor.blocksize,
        attn_implementation=model.config._attn_implementation,
        true_sequential=request.true_sequential and pipeline == SEQUENTIAL,
        refine_passes=request.refine_passes if request.method == GPTQ else None,
    )


def _check_targets(model: torch.nn.Module, compressor: LayerCompressor, name: str) -> list[str]:
    """The paths of the targeted layers: something must be targeted, and every group must
    fit its layer, before calibration."""
    targets = [(n, m) for n, m in model.named_modules() if compressor.is_target(n, m)]
    if not targets:
        raise BadInputError(
            f"no layer of {name} is targeted by the scheme.",
            hint="Check the scheme's targets and ignore patterns.",
            param="scheme",
        )
    args = compressor.scheme.weights if compressor.scheme is not None else None
    if args is not None and args.strategy == "group" and args.group_size:
        misfits = [n for n, m in targets if m.in_features % args.group_size]
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
