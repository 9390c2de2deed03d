"""The sections of a compression run besides its stages: calibration, tracing, checkpoint.

Torch-free at import, as the declarations are (the command line builds its options from them
and answers ``--help`` without importing torch).

Each is a dataclass whose fields are the run's options (:mod:`~llmc_trace.core.declare`),
and each is a section of a recipe under the same name; :data:`SECTIONS` lists them in the
order a recipe writes them, the stages last.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmc_trace.core.names import AUTO, DEFAULT_MAX_SHARD_SIZE, DTYPES, MODALITIES, TEXT_LISTS
from llmc_trace.core.declare import Int, Parsed, Text, normalize, option
from llmc_trace.spec.stage import Stage
from llmc_trace.tracing.settings import TracingSettings

if TYPE_CHECKING:
    import torch

    from llmc_trace.data.columns import Columns


@dataclass(frozen=True)
class CalibrationSettings:
    """Which rows calibrate the model, and how they run through it.

    ``attn_implementation``: the attention kernel calibration runs, ``sdpa`` by default (what
    transformers and vLLM serve with: the same function as ``eager`` without holding each
    head's full attention matrix, so calibration is faster and peaks lower); architectures
    without it fall back to ``eager``.
    """

    dataset: str | None = option(
        None,
        "Calibration data: .npy token array, .jsonl/.json/.parquet/.txt file, or hub id (or "
        "the recipe's).",
        Parsed(lambda value: _path_text(value), description="a path or hub id"),
        short="-d",
    )
    modality: str = option(
        AUTO,
        "text, image, video or audio (auto: from the dataset's columns); media rows go through "
        "the model folder's own processor and chat template.",
        Text(choices=(AUTO, *MODALITIES)),
    )
    text_column: str | None = option(
        None,
        "The column holding the text (default: text, caption, content, prompt or messages).",
        Parsed(lambda value: _column(value), description="a column name"),
    )
    image_column: str | None = option(
        None,
        "The column holding the images (default: images, image, image_path or image_bytes).",
        Parsed(lambda value: _column(value), description="a column name"),
    )
    audio_column: str | None = option(
        None,
        "The column holding the audio (default: audios, audio, audio_path or waveform).",
        Parsed(lambda value: _column(value), description="a column name"),
    )
    text_lists: str = option(
        "first",
        "A text column holding lists (flickr30k's five captions): use the first text, each "
        "text as its own sample, or all joined.",
        Text(choices=TEXT_LISTS),
    )
    samples: int = option(128, "Calibration samples.", Int(1))
    seq_len: int = option(512, "Tokens per sample.", Int(2))
    batch_size: int = option(1, "Samples per forward pass.", Int(1))
    seed: int = option(0, "Shuffling seed.", Int(0))
    attn_implementation: str = option(
        "sdpa",
        "Attention kernel for calibration (eager where the model has no sdpa).",
        Text(choices=("sdpa", "eager")),
    )

    def __post_init__(self) -> None:
        normalize(self)

    def columns(self) -> Columns:
        """The columns named, as the data loaders take them."""
        from llmc_trace.data.columns import Columns

        return Columns(self.text_column, self.image_column, self.audio_column, self.text_lists)


@dataclass(frozen=True)
class CheckpointSettings:
    """How the checkpoint is stored: ``dtype`` ``None`` keeps the one the model's
    ``config.json`` declares (what it was saved in); ``max_shard_size``: bytes of tensors per
    output shard."""

    dtype: torch.dtype | None = option(
        None,
        "The checkpoint's dtype (auto: the one config.json declares).",
        Parsed(lambda value: _read_dtype(value), lambda value: _dtype_name(value), choices=DTYPES),
    )
    max_shard_size: int = option(
        DEFAULT_MAX_SHARD_SIZE,
        "Bytes of tensors per output shard (e.g. 5GB, 500MiB).",
        Parsed(lambda value: _read_bytes(value), description="a byte count"),
    )

    def __post_init__(self) -> None:
        normalize(self)


#: recipe section -> the dataclass of its options; ``stages`` holds a list of them
SECTIONS: dict[str, type] = {
    "calibration": CalibrationSettings,
    "tracing": TracingSettings,
    "checkpoint": CheckpointSettings,
    "stages": Stage,
}


def _path_text(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    raise ValueError(f"must be a path or a hub id, not {value!r}")


def _column(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ValueError(f"must be a column name, not {value!r}")


def _read_dtype(value: object) -> torch.dtype | None:
    import torch

    if value is None or value == AUTO:
        return None
    if isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f"must be one of {', '.join(DTYPES)}, not {value!r}")
    return getattr(torch, str(value))


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _read_bytes(value: Any) -> int:
    from llmc_trace.core.sizes import parse_bytes

    if isinstance(value, str):
        return parse_bytes(value, "max_shard_size")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"must be a positive byte count, not {value!r}")
    return value
