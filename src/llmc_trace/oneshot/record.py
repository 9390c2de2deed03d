"""What a run leaves besides its weights, built once from its stages' results: the
compression report (``report.json``, ``report.html``) and ``recipe.yaml``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from llmc_trace.oneshot.recipe import render_recipe
from llmc_trace.oneshot.report import build_report
from llmc_trace.oneshot.result import StageResult
from llmc_trace.oneshot.solve import LayerResult
from llmc_trace.oneshot.state import RunContext
from llmc_trace.report.schema import CompressionReport


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
        calibration=context.calibration,
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
