"""What a run leaves besides its weights, built once from its stages' results: the
compression report (``report.json``, ``report.html``: each stage's layer results placed in the
traced model) and ``recipe.yaml``.

The driver builds both after the last stage and before its checkpoint is renamed into place,
so they appear atomically with the weights they describe; it returns the same report in its
result (the only copy when it compresses in memory).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

import torch

from llmc_trace.checkpoint.served import served_together
from llmc_trace.calibrate.solve import LayerResult
from llmc_trace.core.declare import written
from llmc_trace.core.names import BASELINE, DATA_METHODS, MAGNITUDE
from llmc_trace.data import CalibrationSet
from llmc_trace.data.multimodal import MultimodalCalibrationSet
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.result import StageResult
from llmc_trace.oneshot.state import RunContext
from llmc_trace.report.page import render_report_html
from llmc_trace.report.schema import (
    CompressionReport,
    LayerRow,
    ReportSettings,
    StageSettings,
    SubgraphRow,
)
from llmc_trace.spec.recipe import render_recipe
from llmc_trace.spec.stage import Stage
from llmc_trace.traced.model import TracedModel, display_name


def run_report(
    context: RunContext, results: Sequence[StageResult], dtype: torch.dtype
) -> CompressionReport:
    """The report of the stages as they ran, with their compressed layers."""
    return build_report(
        context.request,
        [(result.stage, result.layers) for result in results],
        context.trace.traced,
        device=context.device,
        dtype=dtype,
        device_peak_bytes=context.device_peaks.current(context.device),
        calibration=context.calibration if context.request.needs_data else None,
    )


def run_recipe(context: RunContext, results: Sequence[StageResult], dtype: torch.dtype) -> str:
    """``recipe.yaml``: this run, resolved (the stages as they ran, the tracing ignore list
    with its fixes, ``dtype`` the checkpoint's), as a recipe that runs it again; the layers
    each stage compressed otherwise than its method are comments under it."""
    request = context.request
    recipe = request.recipe()
    recipe = dataclasses.replace(
        recipe,
        calibration=dataclasses.replace(recipe.calibration, modality=request.modality),
        tracing=dataclasses.replace(
            recipe.tracing, tracing_ignore=tuple(context.trace.ignore_list())
        ),
        checkpoint=dataclasses.replace(recipe.checkpoint, dtype=dtype),
        stages=tuple(result.stage for result in results),
    )
    return render_recipe(recipe, fallbacks=[_notes(result.layers) for result in results])


def _notes(layers: list[LayerResult]) -> list[str]:
    """The layers compressed otherwise than their stage's method, with what was done."""
    return [f"{layer.name}: {layer.fallback}" for layer in layers if layer.fallback]


def build_report(
    request: CompressRequest,
    stages: Sequence[tuple[Stage, Sequence[LayerResult]]],
    traced: TracedModel | None,
    *,
    device: torch.device,
    dtype: torch.dtype,
    device_peak_bytes: int | None,
    calibration: CalibrationSet | None = None,
) -> CompressionReport:
    """The report of ``stages`` (each as it ran, with its compressed layers, in order) of the
    run ``request`` asked for; ``traced`` places each layer in its subgraph;
    ``device_peak_bytes``: the run's CUDA peak so far; ``calibration``: the samples the run
    calibrated on (None for a data-free run), whose tokens the report counts."""
    subgraph_of = _subgraph_index(traced)
    names = [[result.name for result in results] for _, results in stages]
    layers = tuple(
        _row(index, stage, result, subgraph_of, names[index])
        for index, (stage, results) in enumerate(stages)
        for result in results
    )
    return CompressionReport(
        model=display_name(request.source),
        device=device.type,
        device_peak_bytes=device_peak_bytes,
        settings=ReportSettings(
            dataset=str(request.calibration.dataset or "none"),
            samples=request.calibration.samples,
            seq_len=request.calibration.seq_len,
            batch_size=request.calibration.batch_size,
            seed=request.calibration.seed,
            dtype=str(dtype).removeprefix("torch."),
            stages=tuple(_stage_settings(stage) for stage, _ in stages),
            tokens=calibration.num_tokens if calibration is not None else None,
            media_tokens=_media_tokens(calibration),
        ),
        subgraphs=tuple(
            SubgraphRow(s.index, tuple(s.targets)) for s in (traced.subgraphs if traced else ())
        ),
        layers=layers,
    )


def report_files(report: CompressionReport) -> dict[str, str]:
    """The files of the report in a checkpoint folder, by name."""
    return {"report.json": report.dumps(), "report.html": render_report_html(report)}


def _media_tokens(calibration: CalibrationSet | None) -> int | None:
    """How many of the calibrated tokens were media placeholders (0 for text)."""
    if calibration is None:
        return None
    if isinstance(calibration, MultimodalCalibrationSet):
        return sum(stats.placeholder_tokens for stats in calibration.batch_stats)
    return 0


def _stage_settings(stage: Stage) -> StageSettings:
    scheme = stage.scheme
    sparsity = stage.sparsity
    return StageSettings(
        method=stage.method,
        scheme=scheme.name if scheme is not None else None,
        weights=dataclasses.asdict(scheme.weights) if scheme is not None else None,
        sparsity=(
            f"{sparsity[0]}:{sparsity[1]}"
            if isinstance(sparsity, tuple)
            else (None if sparsity is None else f"{sparsity:g}")
        ),
        pipeline=stage.pipeline,
        solver=written(stage.solver),
    )


def _row(
    index: int,
    stage: Stage,
    result: LayerResult,
    subgraph_of: dict[str, int],
    stage_layers: list[str],
) -> LayerRow:
    """The report's row of one layer; its ``--ignore`` suggestion names the layers a server
    fuses with it too (:mod:`llmc_trace.checkpoint.served`), so that following it gives a
    checkpoint vLLM loads."""
    together = served_together(result.name, stage_layers)
    calibrated = stage.method in DATA_METHODS and result.fallback is None
    baseline = BASELINE.get(stage.method)
    if baseline == MAGNITUDE and stage.scheme is not None:
        baseline = "magnitude+rtn"  # magnitude pruning rounds what it keeps when quantizing
    return LayerRow(
        name=result.name,
        stage=index,
        method=stage.method if result.fallback is None else BASELINE[stage.method],
        baseline=baseline,
        loss=result.loss if calibrated else None,
        baseline_loss=result.baseline_loss,
        num_tokens=result.num_tokens,
        seconds=result.seconds,
        device_peak_bytes=result.device_peak_bytes,
        shares_hessian_with=result.shares_hessian_with,
        subgraph=_find(result.name, subgraph_of),
        fallback=result.fallback,
        ignore=" ".join(f"--ignore {shlex.quote(name)}" for name in together)
        if stage.scheme is not None
        else None,
    )


def _subgraph_index(traced: TracedModel | None) -> dict[str, int]:
    """Module path -> the subgraph that calls it (its first, if several do)."""
    index: dict[str, int] = {}
    for subgraph in traced.subgraphs if traced is not None else ():
        for path in subgraph.module_paths():
            index.setdefault(path, subgraph.index)
    return index


def _find(name: str, subgraph_of: dict[str, int]) -> int | None:
    """The subgraph that runs layer ``name``: the one calling it or its nearest ancestor."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        found = subgraph_of.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None
