"""Load a checkpoint folder (original or compressed) and measure its perplexity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llmc_trace.core.progress import Progress
from llmc_trace.data import load_calibration
from llmc_trace.errors import BadInputError
from llmc_trace.evaluate.perplexity import PerplexityResult, perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model


def load_for_evaluation(folder: str | Path) -> torch.nn.Module:
    """The checkpoint in ``folder`` in float32 with transformers' default attention kernel."""
    path = Path(folder)
    if not (path / "config.json").exists():
        raise BadInputError(
            f"{folder} holds no config.json.",
            hint="Point --model at a checkpoint folder.",
            param="model",
        )
    return load_pretrained(resolve_model(str(path)), attn_implementation=None)


def evaluate_model(
    folder: str | Path,
    data: str | Path,
    *,
    samples: int | None = None,
    seq_len: int = 512,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> PerplexityResult:
    """Perplexity of the checkpoint in ``folder`` on ``data`` (a .npy array or a text file)."""
    if str(data).endswith(".npy"):
        tokens = np.load(data)
        rows = tokens if samples is None else tokens[:samples]
        return perplexity(
            load_for_evaluation(folder), rows, batch_size=batch_size, progress=progress
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    calibration = load_calibration(
        data,
        tokenizer,
        samples=samples or 128,
        seq_len=seq_len,
        shuffle=False,
        batch_size=batch_size,
    )
    return perplexity(
        load_for_evaluation(folder), calibration, batch_size=batch_size, progress=progress
    )
