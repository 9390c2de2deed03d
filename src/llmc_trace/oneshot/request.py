"""``CompressRequest``: every input of ``compress``, checked once before any heavy work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from llmc_trace.compress.scheme import QuantizationScheme, resolve_scheme
from llmc_trace.compress.sparsegpt import Sparsity
from llmc_trace.core.names import (
    AUTO,
    DATA_METHODS,
    METHODS,
    PIPELINES,
    PRUNING_METHODS,
    SEQUENTIAL,
)
from llmc_trace.data import validate_source
from llmc_trace.errors import BadInputError
from llmc_trace.models.source import ModelSource, resolve_model


@dataclass(frozen=True)
class CompressRequest:
    """What to compress, how, and where to; built by :meth:`validate` only.

    ``scheme`` is ``None`` for pruning without quantization, ``sparsity`` ``None`` for
    quantization without pruning; ``out_dir`` ``None`` compresses in memory only.
    """

    source: ModelSource
    dataset: str | Path
    data_kind: str  # what the dataset is: "npy" token ids, a text file, a hub dataset...
    method: str
    scheme: QuantizationScheme | None
    sparsity: Sparsity | None
    out_dir: Path | None
    overwrite: bool
    samples: int
    seq_len: int
    batch_size: int
    seed: int
    pipeline: str
    propagate_error: bool
    true_sequential: bool
    refine_passes: int
    attn_implementation: str
    dtype: torch.dtype | None

    @property
    def needs_data(self) -> bool:
        return self.method in DATA_METHODS

    @classmethod
    def validate(
        cls,
        model: str | ModelSource,
        *,
        dataset: str | Path,
        out_dir: str | Path | None,
        scheme: str | QuantizationScheme | None,
        method: str,
        sparsity: str | float | None,
        samples: int,
        seq_len: int,
        batch_size: int,
        seed: int,
        pipeline: str,
        propagate_error: bool,
        true_sequential: bool,
        refine_passes: int,
        attn_implementation: str,
        dtype: torch.dtype | None,
        overwrite: bool,
    ) -> CompressRequest:
        """Check every input (names, combinations, the model's weights, the output folder, the
        dataset's shape) and resolve the scheme and sparsity; raises
        :class:`~llmc_trace.errors.BadInputError` naming the parameter."""
        if method not in METHODS:
            raise BadInputError(
                f"unknown method {method!r}.",
                hint=f"Use one of {', '.join(METHODS)}.",
                param="method",
            )
        if pipeline not in (AUTO, *PIPELINES):
            raise BadInputError(
                f"unknown pipeline {pipeline!r}.",
                hint=f"Use one of {', '.join((AUTO, *PIPELINES))}.",
                param="pipeline",
            )
        if true_sequential and (pipeline not in (AUTO, SEQUENTIAL) or not propagate_error):
            raise BadInputError(
                "true-sequential calibration needs the sequential pipeline with error "
                f"propagation (got pipeline {pipeline!r}"
                f"{', no propagation' if not propagate_error else ''}).",
                hint="Drop --true-sequential, or use --pipeline sequential without --no-propagate.",
                param="true_sequential",
            )
        if refine_passes < 0:
            raise BadInputError(
                f"refine passes must be 0 or more (got {refine_passes}).",
                hint="Pass --refine-passes 0 for GPTQ without refinement, or a positive limit.",
                param="refine_passes",
            )
        resolved_scheme = resolve_scheme(scheme) if isinstance(scheme, str) else scheme
        resolved_sparsity = parse_sparsity(sparsity)
        if method in PRUNING_METHODS and resolved_sparsity is None:
            raise BadInputError(
                f"{method} needs a sparsity.", hint="Pass --sparsity 0.5 or 2:4.", param="sparsity"
            )
        if method not in PRUNING_METHODS and resolved_scheme is None:
            raise BadInputError(
                f"{method} needs a quantization scheme.",
                hint="Pass --scheme W4A16.",
                param="scheme",
            )
        source = model if isinstance(model, ModelSource) else resolve_model(str(model))
        if not source.has_weights:
            raise BadInputError(
                f"{source.name} has no weights (*.safetensors) to compress.",
                hint="Point --model at a checkpoint folder; built-ins hold configs only.",
                param="model",
            )
        target_dir = Path(out_dir) if out_dir is not None else None
        if target_dir is not None and target_dir.exists() and not overwrite:
            raise BadInputError(
                f"the output folder {target_dir} already exists.",
                hint="Choose another --out, or pass --overwrite.",
                param="out",
            )
        data = validate_source(dataset, samples=samples, seq_len=seq_len)
        return cls(
            source=source,
            dataset=dataset,
            data_kind=data.kind,
            method=method,
            scheme=resolved_scheme,
            sparsity=resolved_sparsity,
            out_dir=target_dir,
            overwrite=overwrite,
            samples=samples,
            seq_len=seq_len,
            batch_size=batch_size,
            seed=seed,
            pipeline=pipeline,
            propagate_error=propagate_error,
            true_sequential=true_sequential,
            refine_passes=refine_passes,
            attn_implementation=attn_implementation,
            dtype=dtype,
        )


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
