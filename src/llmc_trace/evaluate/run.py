"""Load a checkpoint folder (original or compressed) and measure its perplexity."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from llmc_trace.core.progress import Progress
from llmc_trace.data import load_calibration
from llmc_trace.data.multimodal import load_multimodal_calibration, source_modality
from llmc_trace.data.source import resolve_source
from llmc_trace.data.columns import Columns
from llmc_trace.data.tokens import count_windows, open_token_array
from llmc_trace.evaluate.perplexity import PerplexityResult, perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.samples import check_seq_len
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.models.tokenizer import load_tokenizer


def load_for_evaluation(
    model: str | Path | ModelSource, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """The checkpoint with transformers' default attention kernel, in ``dtype`` (default: the
    one its config declares, as it is served)."""
    source = model if isinstance(model, ModelSource) else resolve_model(str(model))
    return load_pretrained(source, attn_implementation=None, dtype=dtype)


def evaluate_model(
    folder: str | Path,
    data: str | Path,
    *,
    samples: int | None = None,
    seq_len: int = 512,
    batch_size: int = 8,
    modality: str | None = None,
    columns: Columns | None = None,
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> PerplexityResult:
    """Perplexity of the checkpoint in ``folder`` on ``data``: a .npy array, a text file, or
    rows of media and text (:func:`evaluate_multimodal`, chosen from the columns as
    ``compress`` chooses; ``modality`` forces one, ``"text"`` reads a table's text alone).
    ``columns`` names the text, image and audio columns and how text lists are read, as for
    ``compress`` (by default the loaders' usual names).

    A 2-D token array is scored row by row at its own length, a 1-D stream in windows of
    ``seq_len``; ``samples`` takes the first rows (all by default; of text, every window up to
    ``TEXT_WINDOWS``, the last one shorter, and ``notes`` says how many were scored). The data
    goes through the calibration loader's checks (file type, pickles, ids inside the model's
    vocabulary) before the model is loaded, so bad data is refused in a second. ``dtype``:
    see :func:`load_for_evaluation`.
    """
    source = resolve_model(str(folder))
    source.weights_folder("evaluate")  # a built-in or hub id: refused before the data is read
    columns = columns or Columns()
    media = source_modality(data, modality, columns)
    if media is not None:
        result = evaluate_multimodal(
            folder, data, samples=samples, seq_len=seq_len, batch_size=batch_size,
            modality=media.modality, columns=columns, dtype=dtype, progress=progress,
        )  # fmt: skip
        return replace(result, modality=media.modality)
    resolved = resolve_source(data)
    tokenizer = None
    if resolved.is_token_array:
        assert resolved.path is not None
        array = open_token_array(resolved.path, resolved.description)
        seq_len = array.shape[1] if array.ndim == 2 else seq_len
        samples = samples or count_windows(array, seq_len, resolved.description)
    else:
        tokenizer = load_tokenizer(Path(folder))
    check_seq_len(source.config(), seq_len)  # a 2-D array's own width, else the windows'
    calibration = load_calibration(
        data,
        tokenizer,
        samples=samples or TEXT_WINDOWS,
        seq_len=seq_len,
        shuffle=False,
        batch_size=batch_size,
        vocab_size=_vocab_size(source),
        up_to=samples is None,
        column=columns.text,
        text_lists=columns.text_lists,
    )
    result = perplexity(
        load_for_evaluation(source, dtype), calibration, batch_size=batch_size, progress=progress
    )
    scored = _scored(calibration.num_samples, calibration.num_tokens, seq_len, asked=samples)
    return replace(result, notes=(*calibration.notes, scored))


#: Windows of text ``evaluate`` scores when no sample count is asked for.
TEXT_WINDOWS = 128


def _scored(windows: int, tokens: int, seq_len: int, *, asked: int | None) -> str:
    """The sentence saying how much text was scored."""
    if asked is None and windows < TEXT_WINDOWS:
        return (
            f"scored all the text: {windows} windows of at most {seq_len} tokens, {tokens} "
            f"tokens (fewer than the {TEXT_WINDOWS} windows scored by default)"
        )
    more = "" if asked is not None else " (--samples scores more)"
    return f"scored the first {windows} windows of {seq_len} tokens, {tokens} tokens{more}"


def evaluate_multimodal(
    folder: str | Path,
    data: str | Path,
    *,
    samples: int | None = None,
    seq_len: int = 512,
    batch_size: int = 8,
    modality: str | None = None,
    columns: Columns | None = None,
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> PerplexityResult:
    """Perplexity of the text of ``data`` given its images, video or audio, for the checkpoint
    in ``folder`` (``columns``: as for :func:`evaluate_model`).

    ``data`` is read as calibration rows are (:func:`~llmc_trace.data.multimodal.
    load_multimodal_calibration`, in file order): the first ``samples`` rows that fit
    ``seq_len`` (``None``: every one, each text of a list when ``columns`` reads lists as
    rows), through the folder's own processor. Media placeholder tokens and padding are
    never scored. The data and the processor are checked before the model is loaded.
    """
    source = resolve_model(str(folder))
    source.weights_folder("evaluate")
    check_seq_len(source.config(), seq_len)
    calibration = load_multimodal_calibration(
        data,
        folder,
        samples=samples,
        seq_len=seq_len,
        batch_size=batch_size,
        modality=modality,
        columns=columns,
        shuffle=False,
        vocab_size=_vocab_size(source),
    )
    model = load_for_evaluation(source, dtype)
    return replace(perplexity(model, calibration, progress=progress), notes=calibration.notes)


def _vocab_size(source: ModelSource) -> int | None:
    """The rows of the model's embedding table, from its config (before the model loads, so
    bad data is refused first)."""
    return getattr(source.config().get_text_config(), "vocab_size", None)
