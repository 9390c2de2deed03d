"""A smoothing stage's smooth -> balance pairs: found on the model it compresses, proved on its
twin."""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.errors import BadInputError, TraceStopped
from llmc_trace.models.build import twin_of_class
from llmc_trace.models.samples import SampleOptions
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.oneshot.state import RunContext
from llmc_trace.traced.mappings import MappingSet, find_mappings
from llmc_trace.traced.probe import sample_for


def stage_mappings(
    run: RunContext, model: torch.nn.Module, batch: dict[str, Any], compressor: LayerCompressor
) -> MappingSet:
    """The pairs of ``model`` whose balance layers ``compressor`` targets, each proved on the
    twin; a model no pair of which is found is bad input (nothing would be smoothed)."""
    if run.world.size > 1:
        raise BadInputError(
            "awq and smoothquant compute each pair's scales from all calibration rows, and "
            "this run shares them among processes.",
            hint="Run awq or smoothquant in one process (without torchrun).",
            param="method",
        )
    options = run.trace.options
    assert options is not None, "the stage traces the model before it looks for pairs"
    twin = twin_of_class(type(model), model.config)  # type: ignore[arg-type]
    twin_sample = sample_for(twin, run.trace.modality, SampleOptions())
    try:
        found = find_mappings(
            model, batch, twin, twin_sample, options,
            compressor.is_target,
        )  # fmt: skip
    except TraceStopped as stopped:
        raise BadInputError(
            f"the smooth -> balance pairs are read from a trace into every layer, and "
            f"{run.request.source.name} did not trace so ({stopped}).",
            hint="Use gptq or rtn for this model, or make its layers traceable "
            "(`llmc-trace attempt --mappings` shows where the trace stops).",
            param="method",
        ) from None
    if not found.mappings:
        raise BadInputError(
            f"no smooth -> balance pair of {run.request.source.name} could be proved on its twin"
            + (
                f" (e.g. {found.skipped[0].smooth}: {found.skipped[0].reason})."
                if found.skipped
                else "."
            ),
            hint="Use gptq or rtn for this model; `llmc-trace plan --mappings` lists the pairs.",
            param="method",
        )
    return found
