"""``CompressRequest``: every input of a compression run, checked once before any heavy work."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmc_trace.checkpoint.shards import DEFAULT_MAX_SHARD_SIZE
from llmc_trace.compress.scheme import QuantizationScheme, resolve_scheme
from llmc_trace.compress.sparsegpt import Sparsity
from llmc_trace.core.names import (
    AUTO,
    DATA_METHODS,
    GPTQ,
    METHODS,
    PIPELINES,
    PRUNING_METHODS,
    SEQUENTIAL,
)
from llmc_trace.data import validate_source
from llmc_trace.errors import BadInputError
from llmc_trace.models.samples import check_seq_len
from llmc_trace.models.weights import check_weight_files
from llmc_trace.models.source import ModelSource, resolve_model


@dataclass(frozen=True)
class CompressRequest:
    """What to compress, how, and where to; constructing one checks all of it.

    ``model``: a folder with weights. ``method``: ``gptq`` (with ``scheme``), ``sparsegpt``
    (with ``sparsity``, and ``scheme`` to also quantize), ``rtn`` or ``magnitude`` (the
    baselines). ``pipeline="auto"`` takes the memory plan's choice. ``out_dir=None``
    compresses in memory only (for evaluation). ``attn_implementation``: the attention kernel
    calibration runs, ``sdpa`` by default (what transformers and vLLM serve with: the same
    function as ``eager`` without holding each head's full attention matrix, so calibration is
    faster and peaks lower); architectures without it fall back to ``eager``.
    ``true_sequential`` calibrates each subgraph's layers in dependency stages (q/k/v, then o,
    then gate/up, then down), each on inputs from the stages before it already compressed; the
    sequential pipeline only, about 1.5x the calibration time. ``refine_passes``: at most this
    many passes of coordinate descent after each GPTQ sweep (`llmc_trace.compress.refine`);
    0, the default, runs GPTQ alone (why: `llmc_trace.compress.gptq.gptq`). ``dtype``: the
    checkpoint's dtype, ``None`` for the one the model's ``config.json`` declares (what it was
    saved in); ``max_shard_size``: bytes of tensors per output shard.

    Construction raises :class:`~llmc_trace.errors.BadInputError` naming the parameter (names,
    combinations, the model's weights, the output folder, the dataset's shape) and resolves
    the derived fields: ``source``, ``quantization`` (``None`` to prune only),
    ``target_sparsity`` (``None`` to quantize only), ``out_path`` and ``data_kind``.
    """

    model: str | Path | ModelSource
    dataset: str | Path
    out_dir: str | Path | None = None
    scheme: str | QuantizationScheme | None = "W4A16"
    method: str = GPTQ
    sparsity: str | float | None = None
    samples: int = 128
    seq_len: int = 512
    batch_size: int = 1
    seed: int = 0
    pipeline: str = AUTO
    propagate_error: bool = True
    true_sequential: bool = False
    refine_passes: int = 0
    attn_implementation: str = "sdpa"
    dtype: torch.dtype | None = None
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    overwrite: bool = False
    source: ModelSource = field(init=False, repr=False)
    quantization: QuantizationScheme | None = field(init=False, repr=False)
    target_sparsity: Sparsity | None = field(init=False, repr=False)
    out_path: Path | None = field(init=False, repr=False)
    #: what the dataset is: "npy" token ids, a text file, a hub dataset...
    data_kind: str = field(init=False, repr=False)

    @property
    def needs_data(self) -> bool:
        return self.method in DATA_METHODS

    def __post_init__(self) -> None:
        self._check_choices()
        quantization = resolve_scheme(self.scheme) if isinstance(self.scheme, str) else self.scheme
        target_sparsity = parse_sparsity(self.sparsity)
        if self.method in PRUNING_METHODS and target_sparsity is None:
            raise BadInputError(
                f"{self.method} needs a sparsity.",
                hint="Pass --sparsity 0.5 or 2:4.",
                param="sparsity",
            )
        if self.method not in PRUNING_METHODS and quantization is None:
            raise BadInputError(
                f"{self.method} needs a quantization scheme.",
                hint="Pass --scheme W4A16.",
                param="scheme",
            )
        model = self.model
        source = model if isinstance(model, ModelSource) else resolve_model(str(model))
        if source.folder is None:
            raise BadInputError(
                f"{source.name} has no weights to compress: built-ins and hub ids are configs.",
                hint="Point --model at a checkpoint folder (config.json beside *.safetensors).",
                param="model",
            )
        check_weight_files(source.folder)  # headers only: pickles, truncation, lost shards
        check_seq_len(source.config(), self.seq_len)
        out_path = Path(self.out_dir) if self.out_dir is not None else None
        if out_path is not None and out_path.exists() and not self.overwrite:
            raise BadInputError(
                f"the output folder {out_path} already exists.",
                hint="Choose another --out, or pass --overwrite.",
                param="out",
            )
        data = validate_source(self.dataset, samples=self.samples, seq_len=self.seq_len)
        for name, value in (
            ("source", source),
            ("quantization", quantization),
            ("target_sparsity", target_sparsity),
            ("out_path", out_path),
            ("data_kind", data.kind),
        ):
            object.__setattr__(self, name, value)

    def _check_choices(self) -> None:
        """Names and combinations, the checks that need nothing loaded."""
        if self.method not in METHODS:
            raise BadInputError(
                f"unknown method {self.method!r}.",
                hint=f"Use one of {', '.join(METHODS)}.",
                param="method",
            )
        if self.pipeline not in (AUTO, *PIPELINES):
            raise BadInputError(
                f"unknown pipeline {self.pipeline!r}.",
                hint=f"Use one of {', '.join((AUTO, *PIPELINES))}.",
                param="pipeline",
            )
        if self.true_sequential and (
            self.pipeline not in (AUTO, SEQUENTIAL) or not self.propagate_error
        ):
            raise BadInputError(
                "true-sequential calibration needs the sequential pipeline with error "
                f"propagation (got pipeline {self.pipeline!r}"
                f"{', no propagation' if not self.propagate_error else ''}).",
                hint="Drop --true-sequential, or use --pipeline sequential without --no-propagate.",
                param="true_sequential",
            )
        if self.max_shard_size < 1:
            raise BadInputError(
                f"the shard size must be positive (got {self.max_shard_size} bytes).",
                hint="Pass e.g. --max-shard-size 5GB.",
                param="max_shard_size",
            )
        if self.refine_passes < 0:
            raise BadInputError(
                f"refine passes must be 0 or more (got {self.refine_passes}).",
                hint="Pass --refine-passes 0 for GPTQ without refinement, or a positive limit.",
                param="refine_passes",
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
