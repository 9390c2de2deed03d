"""Load calibration samples from any supported source into padded, masked batches.

The steps, each in its own module: resolve the source (`source`), check it cheaply
(`validation`), read its rows (`tables`, `hub`, `tokens`), shuffle them with an explicit seed,
tokenise and pack or truncate them (`texts`, `packing`), and pad them into batches (`batching`).
The same arguments always give the same batches: shuffling uses `numpy.random.default_rng(seed)`
and nothing else is random.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from llmc_trace.data.batching import pad_batches
from llmc_trace.data.columns import Columns, is_text_list, text_list_note, texts_of
from llmc_trace.errors import DataError
from llmc_trace.data.hub import read_hub_table
from llmc_trace.data.packing import pack_texts, truncate_texts
from llmc_trace.data.saved import read_saved_table
from llmc_trace.data.source import ResolvedSource, resolve_source
from llmc_trace.data.tables import TextTable, read_text_table
from llmc_trace.data.texts import choose_text_column, render_text
from llmc_trace.data.tokens import check_token_range, count_windows, open_token_array, take_windows
from llmc_trace.data.validation import check_enough, check_sizes

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class CalibrationSet:
    """Calibration samples ready to feed a model, batch by batch.

    Each batch is `{"input_ids", "attention_mask"}`, both `(B, T)` long tensors, right-padded with
    mask 0 on padding; `T <= seq_len`. `num_tokens` counts real (mask 1) tokens. `source`
    describes where the samples came from and `seed` is the shuffling seed, for reports.
    """

    batches: list[dict[str, torch.Tensor]]
    num_samples: int
    seq_len: int
    num_tokens: int
    source: str
    seed: int
    #: what a user should know about how the data was read (a column of text lists, rows
    #: dropped), one sentence each; the command line prints them
    notes: tuple[str, ...] = field(default=(), kw_only=True)


def load_calibration(
    source: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    samples: int,
    seq_len: int,
    seed: int = 0,
    batch_size: int = 1,
    pack: bool = True,
    shuffle: bool = True,
    split: str = "train",
    subset: str | None = None,
    column: str | None = None,
    text_lists: str = "first",
    vocab_size: int | None = None,
    up_to: bool = False,
) -> CalibrationSet:
    """Take `samples` samples of at most `seq_len` tokens from `source`, shuffled by `seed`.

    `source` is a local `.jsonl`, `.json`, `.parquet` or `.txt` file, a `.npy` token array, or
    a Hugging Face Hub dataset id (with `subset` and `split`, which takes slices such as
    `"train[:2000]"`). Texts come from `column`, or the first of `text`, `content`, `prompt`,
    `messages`; a cell holding a list of texts (a caption dataset's captions) gives its first,
    each, or all joined, as `text_lists` says (`data.columns`), and `notes` says so. Empty
    texts are skipped, and so are null ones, which `notes` counts. Texts are
    tokenised without added special tokens, then packed (`pack=True`:
    joined with eos and cut into full windows) or truncated (one sample per text). Rows, texts
    or stream windows are visited in an order drawn from `seed`, or in file order with
    `shuffle=False`. A token array needs no tokenizer and is used as is: `pack`, `column`,
    `split` and `subset` do not apply to it. Every sample's ids, tokenised or given, must lie
    in `[0, vocab_size)` (the rows of the model's embedding table; the tokenizer's size when
    `vocab_size` is not given): a tokenizer larger than the model's vocabulary is refused too.
    With `up_to`, a text source with fewer than `samples` windows gives all it has, its last
    window shorter (what `evaluate` scores when no sample count is asked for).

    Raises `DataError` (with a `hint`) for any bad source, and before tokenising wherever the
    problem is visible without it.

    Example::

        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "tokens.npy"
        >>> np.save(path, np.arange(40).reshape(4, 10))
        >>> calib = load_calibration(path, samples=2, seq_len=8, batch_size=2, shuffle=False)
        >>> calib.batches[0]["input_ids"][:, :3].tolist(), calib.num_tokens
        ([[0, 1, 2], [10, 11, 12]], 16)
    """
    check_sizes(samples=samples, seq_len=seq_len, batch_size=batch_size)
    resolved = resolve_source(source)
    order_seed = seed if shuffle else None
    notes: list[str] = []
    if resolved.is_token_array:
        rows = _token_samples(resolved, samples=samples, seq_len=seq_len, seed=order_seed)
    else:
        if tokenizer is None:
            raise DataError(
                f"calibration source {resolved.description} holds text, and no tokenizer was given",
                hint="Pass the model's tokenizer, or use a .npy array of token ids.",
                source=resolved.description,
            )
        table = open_table(resolved, split=split, subset=subset)
        text_column = choose_text_column(table.columns, column, description=table.description)
        Columns(text_lists=text_lists).check(table.columns, table.description)
        values = table.read_column(text_column)
        first = next((v for v in values if v is not None), None) if table.num_rows else None
        if is_text_list(first):
            notes.append(text_list_note(text_column, first, text_lists))
        nulls: list[int] = []
        token_lists = _tokenised_rows(
            table, values, text_column, tokenizer, order_seed, text_lists, nulls
        )
        rows = _text_samples(
            table, token_lists, tokenizer, samples=samples, seq_len=seq_len, pack=pack, up_to=up_to
        )
        if nulls:
            notes.append(
                f"{len(nulls)} rows skipped: their {text_column!r} is null (the first: row "
                f"{nulls[0]})"
            )
    batches = pad_batches(rows, batch_size=batch_size, pad_id=_pad_id(tokenizer))
    limit = vocab_size if vocab_size is not None else (len(tokenizer) if tokenizer else None)
    for batch in batches:
        check_token_range(batch["input_ids"], limit, resolved.description)
    return CalibrationSet(
        batches=batches,
        num_samples=len(rows),
        seq_len=seq_len,
        num_tokens=sum(int(batch["attention_mask"].sum()) for batch in batches),
        source=resolved.description,
        seed=seed,
        notes=tuple(notes),
    )


def visiting_order(count: int, seed: int | None) -> np.ndarray:
    """Indices `0..count-1` in the order drawn from `seed`, or in order when `seed` is None."""
    if seed is None:
        return np.arange(count)
    return np.random.default_rng(seed).permutation(count)


def _token_samples(
    resolved: ResolvedSource, *, samples: int, seq_len: int, seed: int | None
) -> np.ndarray:
    assert resolved.path is not None
    array = open_token_array(resolved.path, resolved.description)
    available = count_windows(array, seq_len, resolved.description)
    check_enough(available, samples=samples, seq_len=seq_len, description=resolved.description)
    return take_windows(array, visiting_order(available, seed)[:samples], seq_len)


def open_table(
    resolved: ResolvedSource, *, split: str = "train", subset: str | None = None
) -> TextTable:
    """The table of a resolved text or media source: a Hub dataset, a `save_to_disk` folder or
    `.arrow` file (through `datasets`), or a local text file."""
    if resolved.hub_id is not None:
        return read_hub_table(resolved.hub_id, split=split, subset=subset)
    assert resolved.path is not None
    if resolved.kind in ("disk", "arrow"):
        return read_saved_table(resolved.path, resolved.kind, resolved.description, split=split)
    return read_text_table(resolved.path, resolved.kind, resolved.description)


def _tokenised_rows(
    table: TextTable,
    values: Sequence[object],
    text_column: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int | None,
    text_lists: str,
    nulls: list[int],
) -> Iterator[list[int]]:
    """Token ids of each row's texts in visiting order, tokenised only when asked for; the
    rows whose text is null are skipped and appended to `nulls`, for `notes` to count."""
    for row in visiting_order(table.num_rows, seed):
        where = f"{table.description}, row {row} of column {text_column!r}"
        value = values[int(row)]
        if value is None:
            # A null is a missing text, as a .jsonl record without the column or a parquet null
            # reads: skipped like an empty text, which also has none, and counted so the user
            # hears of it; a number or other value is refused (render_text), being the wrong
            # column rather than a missing text.
            nulls.append(int(row))
            continue
        cells = texts_of(value, text_lists) if is_text_list(value) else [value]
        for cell in cells:
            text = render_text(cell, tokenizer, where=where)
            yield tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _text_samples(
    table: TextTable,
    token_lists: Iterator[list[int]],
    tokenizer: PreTrainedTokenizerBase,
    *,
    samples: int,
    seq_len: int,
    pack: bool,
    up_to: bool,
) -> list[list[int]]:
    if not pack:
        # Each text gives at most one sample, so a short table fails here, before tokenising.
        check_enough(
            table.num_rows, samples=samples, seq_len=seq_len, description=table.description
        )
        return truncate_texts(
            token_lists, seq_len=seq_len, samples=samples, description=table.description
        )
    if tokenizer.eos_token_id is None:
        raise DataError(
            f"the tokenizer has no eos token to separate packed texts of {table.description}",
            hint="Load calibration with pack=False (one sample per text) instead.",
            source=table.description,
        )
    return pack_texts(
        token_lists,
        seq_len=seq_len,
        eos_id=tokenizer.eos_token_id,
        samples=samples,
        description=table.description,
        up_to=up_to,
    )


def _pad_id(tokenizer: PreTrainedTokenizerBase | None) -> int:
    """The tokenizer's pad id, else its eos id, else 0; masked out either way."""
    for token_id in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if token_id is not None:
            return int(token_id)
    return 0
