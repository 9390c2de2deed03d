"""``compress``: calibrate a model with a planned pipeline and write a compressed-tensors checkpoint.

The steps, each reusing its own module: resolve the model (it must have weights), check every
input before heavy work, load the calibration data, trace with the fixes ``attempt --fix``
would use, plan memory and choose the pipeline, compress subgraph by subgraph, and save the
checkpoint atomically (a temporary folder renamed when complete: an interrupted run leaves no
output folder).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llmc_trace.attempt import attempt_trace
from llmc_trace.checkpoint.recipe import Recipe
from llmc_trace.checkpoint.writer import SparsityInfo, save_compressed
from llmc_trace.compress.scheme import QuantizationScheme, resolve_scheme
from llmc_trace.compress.sparsegpt import Sparsity
from llmc_trace.compressor import DATA_METHODS, METHODS, LayerCompressor, LayerResult
from llmc_trace.data import load_calibration, validate_source
from llmc_trace.errors import BadInputError, LlmcTraceError
from llmc_trace.graph.partition import partition_trace
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.pipelines.basic import run_basic, run_data_free
from llmc_trace.pipelines.layer_sequential import check_layer_sequential, run_layer_sequential
from llmc_trace.pipelines.sequential import PipelineStats, run_sequential
from llmc_trace.plan import MemoryPlan, RunSettings, plan_memory
from llmc_trace.tracing.guards import check_guards, input_signature
from llmc_trace.tracing.definitions import weight_changing
from llmc_trace.tracing.values import forget_example_data
from llmc_trace.tracing.trace import TraceResult, concrete_arguments, trace_graph

logger = logging.getLogger(__name__)
PIPELINES = ("auto", "sequential", "layer_sequential", "basic", "data_free")
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CompressionResult:
    """What ``compress`` did and where the checkpoint is."""

    out_dir: Path | None
    model: torch.nn.Module = field(repr=False)  # the compressed model, in memory
    pipeline: str
    plan: MemoryPlan
    stats: PipelineStats
    layers: list[LayerResult]
    ignore: list[str]
    elapsed_s: float
    fallbacks: list[str]


def parse_sparsity(text: str | float | None) -> Sparsity | None:
    """``0.5`` (unstructured) or ``2:4`` (N:M); a fraction must lie strictly between 0 and 1."""
    if text is None or text == "":
        return None
    if isinstance(text, str) and ":" in text:
        n_text, _, m_text = text.partition(":")
        if not (n_text.isdigit() and m_text.isdigit()) or not 0 < int(n_text) < int(m_text):
            raise BadInputError(
                f"sparsity {text!r} is not an N:M pattern with 0 < N < M.",
                hint="Use e.g. 2:4, or a fraction such as 0.5.",
                param="sparsity",
            )
        return (int(n_text), int(m_text))
    try:
        value = float(text)
    except ValueError:
        raise BadInputError(
            f"sparsity {text!r} is neither a fraction nor N:M.",
            hint="Use e.g. 0.5 or 2:4.",
            param="sparsity",
        ) from None
    if not 0.0 < value < 1.0:
        raise BadInputError(
            f"sparsity {value} is outside (0, 1).",
            hint="Use a fraction such as 0.5, or N:M such as 2:4.",
            param="sparsity",
        )
    return value


def _check_inputs(
    source: ModelSource,
    method: str,
    out_dir: Path | None,
    overwrite: bool,
    pipeline: str,
    scheme: QuantizationScheme | None,
    sparsity: Sparsity | None,
    true_sequential: bool,
    propagate_error: bool,
    refine_passes: int,
) -> None:
    if method not in METHODS:
        raise BadInputError(
            f"unknown method {method!r}.", hint=f"Use one of {', '.join(METHODS)}.", param="method"
        )
    if pipeline not in PIPELINES:
        raise BadInputError(
            f"unknown pipeline {pipeline!r}.",
            hint=f"Use one of {', '.join(PIPELINES)}.",
            param="pipeline",
        )
    if true_sequential and (pipeline not in ("auto", "sequential") or not propagate_error):
        raise BadInputError(
            "true-sequential calibration needs the sequential pipeline with error propagation "
            f"(got pipeline {pipeline!r}{', no propagation' if not propagate_error else ''}).",
            hint="Drop --true-sequential, or use --pipeline sequential without --no-propagate.",
            param="true_sequential",
        )
    if refine_passes < 0:
        raise BadInputError(
            f"refine passes must be 0 or more (got {refine_passes}).",
            hint="Pass --refine-passes 0 for GPTQ without refinement, or a positive limit.",
            param="refine_passes",
        )
    if method in ("sparsegpt", "magnitude") and sparsity is None:
        raise BadInputError(
            f"{method} needs a sparsity.", hint="Pass --sparsity 0.5 or 2:4.", param="sparsity"
        )
    if method in ("gptq", "rtn") and scheme is None:
        raise BadInputError(
            f"{method} needs a quantization scheme.", hint="Pass --scheme W4A16.", param="scheme"
        )
    if not source.has_weights:
        raise BadInputError(
            f"{source.name} has no weights (*.safetensors) to compress.",
            hint="Point --model at a checkpoint folder; built-ins hold configs only.",
            param="model",
        )
    if out_dir is not None and out_dir.exists() and not overwrite:
        raise BadInputError(
            f"the output folder {out_dir} already exists.",
            hint="Choose another --out, or pass --overwrite.",
            param="out",
        )


def compress(
    model: str | ModelSource,
    *,
    dataset: str | Path,
    out_dir: str | Path | None = None,
    scheme: str | QuantizationScheme | None = "W4A16",
    method: str = "gptq",
    sparsity: str | float | None = None,
    samples: int = 128,
    seq_len: int = 512,
    batch_size: int = 1,
    seed: int = 0,
    pipeline: str = "auto",
    propagate_error: bool = True,
    true_sequential: bool = False,
    refine_passes: int = 0,
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    device: torch.device | None = None,
    attn_implementation: str = "sdpa",
    progress: Progress | None = None,
) -> CompressionResult:
    """Compress ``model`` (a folder with weights) and write the checkpoint to ``out_dir``.

    ``method``: ``gptq`` (with ``scheme``), ``sparsegpt`` (with ``sparsity``, and ``scheme`` to
    also quantize), ``rtn`` or ``magnitude`` (the baselines). ``pipeline="auto"`` takes the
    memory plan's choice. ``out_dir=None`` compresses in memory only (for evaluation).
    ``attn_implementation``: the attention kernel calibration runs, ``sdpa`` by default (what
    transformers and vLLM serve with: it computes the same function as ``eager`` without
    holding each head's full attention matrix, so calibration is faster and peaks lower);
    architectures without it fall back to ``eager``. ``true_sequential`` calibrates each
    subgraph's layers in dependency stages (q/k/v, then o, then gate/up, then down), each on
    inputs from the stages before it already compressed; the sequential pipeline only, about
    1.5x the calibration time. ``refine_passes``: at most this many passes of coordinate
    descent after each GPTQ sweep (`llmc_trace.compress.refine`; it stops once no integer can
    move); 0, the default, runs GPTQ alone (why: `llmc_trace.compress.gptq.gptq`).
    """
    start = time.perf_counter()
    report = progress or (lambda description, done, total: None)
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    resolved_scheme = resolve_scheme(scheme) if isinstance(scheme, str) else scheme
    resolved_sparsity = parse_sparsity(sparsity)
    target_dir = Path(out_dir) if out_dir is not None else None
    _check_inputs(
        source,
        method,
        target_dir,
        overwrite,
        pipeline,
        resolved_scheme,
        resolved_sparsity,
        true_sequential,
        propagate_error,
        refine_passes,
    )
    data = validate_source(dataset, samples=samples, seq_len=seq_len)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")

    needs_data = method in DATA_METHODS
    # the fixes `attempt --fix` settles on, found on the tiny twin: a model that cannot be
    # compressed (its definition changes weights) is refused before anything heavy loads
    ignore = _working_ignore(source) if needs_data else []
    report("load", 0, 1)
    loaded = _load(source, attn_implementation)
    if dtype is not None:
        loaded.to(dtype)
    # token ids need no tokenizer (checked against the embedding table instead); the
    # checkpoint copies the tokenizer's files either way
    calibration = load_calibration(
        dataset,
        _tokenizer(source) if data.kind != "npy" else None,
        samples=samples,
        seq_len=seq_len,
        seed=seed,
        batch_size=batch_size,
        vocab_size=loaded.get_input_embeddings().num_embeddings,
    )
    compressor = LayerCompressor(
        method, resolved_scheme, resolved_sparsity, refine_passes=refine_passes
    )
    _check_targets(loaded, compressor, source.name)
    settings = RunSettings(
        samples,
        seq_len,
        batch_size,
        dtype_bytes=next(loaded.parameters()).element_size(),
        needs_data=needs_data,
        kept_bytes_per_weight=0.0 if resolved_scheme is None else 1.0,
    )
    plan = plan_memory(source, settings, ignore=ignore or None)
    chosen = plan.chosen if pipeline == "auto" else pipeline
    stats, used, fallbacks = _run(
        loaded,
        calibration.batches,
        compressor,
        chosen,
        plan,
        ignore,
        device,
        propagate_error,
        true_sequential,
        report,
    )
    if true_sequential and used != "sequential" and needs_data:
        fallbacks.append(
            f"true-sequential: {used} ran instead of sequential; it calibrates each target in "
            "one stage"
        )
    if target_dir is not None:
        recipe = Recipe(
            method,
            calibration.num_samples if needs_data else None,
            seq_len if needs_data else None,
            used,
            seed,
            compressor.percdamp if needs_data else None,
            compressor.blocksize if needs_data else None,
            loaded.config._attn_implementation if needs_data else None,
            true_sequential and used == "sequential" if needs_data else None,
            refine_passes if method == "gptq" else None,
        )
        save_compressed(
            loaded,
            target_dir,
            compressor.quantized,
            [resolved_scheme] if resolved_scheme else [],
            sparsity=SparsityInfo(resolved_sparsity, tuple(compressor.pruned))
            if resolved_sparsity is not None
            else None,
            recipe=recipe,
            tokenizer_dir=source.folder,
            overwrite=overwrite,
        )
    return CompressionResult(
        target_dir,
        loaded,
        used,
        plan,
        stats,
        compressor.results,
        ignore,
        time.perf_counter() - start,
        fallbacks,
    )


def _load(source: ModelSource, attn_implementation: str) -> torch.nn.Module:
    """The model with ``attn_implementation``, or eager where the architecture lacks it."""
    try:
        return load_pretrained(source, attn_implementation)
    except ValueError:
        if attn_implementation == "eager":
            raise
        return load_pretrained(source, "eager")


def _check_targets(model: torch.nn.Module, compressor: LayerCompressor, name: str) -> None:
    """Something must be targeted, and every group must fit its layer, before calibration."""
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


def _check_batches_fit(
    model: torch.nn.Module, trace: TraceResult, batches: list[dict[str, Any]]
) -> None:
    """Every batch must make the decisions the trace took from the first (see guards).

    One graph serves all batches in the sequential pipeline; a batch that would take another
    branch is refused here, before any weight changes, rather than silently run wrongly.
    """
    seen: set[tuple[Any, ...]] = {input_signature(batches[0])}
    for index, batch in enumerate(batches[1:], start=1):
        signature = input_signature(batch)
        if signature in seen:
            continue
        tensors = {k: v for k, v in batch.items() if k in trace.input_names}
        violations = check_guards(trace.graph, model, trace.guards, tensors)
        if violations:
            raise LlmcTraceError(
                f"calibration batch {index} breaks a decision the trace took from batch 0: "
                f"{violations[0].guard.describe()}, got {violations[0].actual!r}.",
                hint="Use batches of equal shape (packed windows, --batch-size 1 with equal "
                "lengths), or --pipeline basic.",
            )
        seen.add(signature)


def _tokenizer(source: ModelSource) -> Any:
    if not source.has_tokenizer:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.folder)


def _working_ignore(source: ModelSource) -> list[str]:
    """The ignore list ``attempt --fix`` settles on for text (empty when it traces as is)."""
    report = attempt_trace(source, fix=True)
    ignore = list(report.applied_fix.ignore) if report.applied_fix else []
    changing = weight_changing(ignore)
    if changing:
        raise BadInputError(
            f"{source.name} traces only through the definition of {', '.join(changing)} in "
            "tracing_models/, which changes the model's weights in place before calibration "
            "(it declares changes_weights); the checkpoint would store the changed weights, and "
            "loading would change them again.",
            hint="Compress another architecture; llmc-trace attempt still traces and verifies it.",
            param="model",
        )
    return ignore


def _run(
    model: torch.nn.Module,
    batches: list[dict[str, Any]],
    compressor: LayerCompressor,
    chosen: str,
    plan: MemoryPlan,
    ignore: list[str],
    device: torch.device,
    propagate_error: bool,
    true_sequential: bool,
    report: Progress,
) -> tuple[PipelineStats, str, list[str]]:
    """Run ``chosen``; on a failure other than running out of memory, fall back in plan order."""
    order = (
        [chosen] + [p for p in plan.fallbacks() if p != chosen]
        if chosen != "data_free"
        else [chosen]
    )
    fallbacks: list[str] = []
    forward_kwargs = concrete_arguments(model, batches[0])
    targets = None
    for name in order:
        try:
            if name == "data_free":
                modules = [m for n, m in model.named_modules() if compressor.is_target(n, m)]
                return run_data_free(model, modules, compressor), name, fallbacks
            trace = trace_graph(model, batches[0], None, ignore or None)
            targets = [model.get_submodule(p) for p in trace.leaves.targets]
            if name == "sequential":
                _check_batches_fit(model, trace, batches)
                subgraphs = partition_trace(trace).subgraphs
                forget_example_data([trace.graph, *(s.graph for s in subgraphs)])
                return (
                    run_sequential(
                        model,
                        subgraphs,
                        batches,
                        compressor,
                        device=device,
                        propagate_error=propagate_error,
                        true_sequential=true_sequential,
                        progress=report,
                    ),
                    name,
                    fallbacks,
                )
            if name == "layer_sequential":
                problems = check_layer_sequential(model, targets, batches[0], forward_kwargs)
                if problems:
                    raise RuntimeError("layer_sequential is not exact here: " + "; ".join(problems))
                return (
                    run_layer_sequential(
                        model,
                        targets,
                        batches,
                        compressor,
                        device=device,
                        propagate_error=propagate_error,
                        progress=report,
                        forward_kwargs=forward_kwargs,
                    ),
                    name,
                    fallbacks,
                )
            return (
                run_basic(
                    model,
                    targets,
                    batches,
                    compressor,
                    device=device,
                    progress=report,
                    forward_kwargs=forward_kwargs,
                ),
                name,
                fallbacks,
            )
        except (torch.OutOfMemoryError, LlmcTraceError):
            raise  # memory is the plan's business; a compressor's error is not the pipeline's
        except Exception as err:  # fall back, saying why; never on out-of-memory
            logger.warning(
                "pipeline %s failed (%s: %s); falling back", name, type(err).__name__, err
            )
            fallbacks.append(f"{name}: {type(err).__name__}: {err}")
    raise RuntimeError("every pipeline failed: " + " | ".join(fallbacks))
