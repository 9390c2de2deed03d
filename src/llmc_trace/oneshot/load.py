"""The model a stage compresses: a skeleton whose weights stream from disk, or loaded whole."""

from __future__ import annotations

import torch

from llmc_trace.errors import BadInputError
from llmc_trace.models.build import build_meta_model, build_skeleton, load_pretrained
from llmc_trace.models.source import ModelSource, quantized_method
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.tracing.definitions import definition_entry, definitions_for, weight_changing


def load_model(
    source: ModelSource,
    store: WeightStore | None,
    *,
    attn_implementation: str,
    dtype: torch.dtype | None,
) -> torch.nn.Module:
    """The model (its skeleton, to fill from ``store``, when there is one) in ``dtype`` (the
    config's when ``None``), with the requested attention kernel, or eager where the
    architecture lacks it."""

    def load(kernel: str) -> torch.nn.Module:
        if store is not None:
            return build_skeleton(source, store, kernel, dtype)
        return load_pretrained(source, kernel, dtype)

    try:
        return load(attn_implementation)
    except ValueError:
        if attn_implementation == "eager":
            raise
        return load("eager")


def refuse_quantized(source: ModelSource) -> None:
    """A checkpoint whose weights are already quantized (its ``config.json`` has a
    ``quantization_config`` with quantized groups, or another method's) is refused, from its
    config alone: its tensors are integers and scales (``weight_packed``), not the weights a
    compressor rounds, and rounding their dequantized values again would stack two errors.
    A compressed-tensors config holding only a sparsity entry (a pruned checkpoint, stored
    dense) is compressed as it is."""
    method = quantized_method(source)
    if method is None:
        return
    raise BadInputError(
        f"{source.name} is already quantized ({method}: its config.json has a "
        "quantization_config); compressing it again would round its rounded weights.",
        hint="Compress the checkpoint it was made from (the original, unquantized weights).",
        param="model",
    )


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
