"""Read a `.npy` token array and cut it into windows of `seq_len` tokens.

Two layouts are accepted, as the refmodel's `calib.npy` and a saved token stream are written:

* 2-D `(rows, length)`: each row is one sample; rows longer than `seq_len` keep their first
  `seq_len` tokens, so `calib.npy` at its own length round-trips row for row.
* 1-D `(length,)`: one token stream, cut into `length // seq_len` non-overlapping windows; the
  incomplete tail is dropped so that every sample is a full window without padding.

The array is memory-mapped: counting windows reads only the header, which keeps
`validate_source` cheap for large arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llmc_trace.errors import DataError

if TYPE_CHECKING:
    import torch


def open_token_array(path: Path, description: str) -> np.ndarray:
    """Memory-map the `.npy` file at `path`, checking that it holds a 1-D or 2-D integer array."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        # numpy raises EOFError ("No data left in file") only for a file of zero bytes
        detail = "the file is empty" if isinstance(err, EOFError) else err
        raise DataError(
            f"data file {description} is not a readable .npy array ({detail})",
            hint="Save the token ids with numpy.save(path, array) as a plain integer array.",
            source=description,
        ) from err
    if array.ndim not in (1, 2) or not np.issubdtype(array.dtype, np.integer):
        raise DataError(
            f"{description} holds a {array.ndim}-D {array.dtype} array, not token ids",
            hint="Use a 2-D integer array (one sample per row) or a 1-D integer token stream.",
            source=description,
        )
    return array


def count_windows(array: np.ndarray, seq_len: int, description: str) -> int:
    """How many samples of `seq_len` tokens `array` gives (rows, or full windows of a stream);
    none is a `DataError` saying why, raised here for every caller (validation, loading,
    `evaluate`)."""
    if array.ndim == 2:
        if array.shape[1] < seq_len:
            raise DataError(
                f"{description} has rows of {array.shape[1]} tokens, shorter than "
                f"seq_len={seq_len}",
                hint=f"Use seq_len <= {array.shape[1]}; rows are samples and are not joined.",
                source=description,
            )
    windows = array.shape[0] if array.ndim == 2 else array.shape[0] // seq_len
    if windows == 0:
        raise _no_window(array, seq_len, description)
    return windows


def _no_window(array: np.ndarray, seq_len: int, description: str) -> DataError:
    """The error for an array that gives no sample at all, saying why (advice to ask for fewer
    samples would mean none)."""
    if array.ndim == 2:
        return DataError(
            f"{description} holds no usable sample: its array has no rows",
            hint="Save at least one row of token ids (a 2-D array holds one sample per row).",
            source=description,
        )
    length = array.shape[0]
    # seq_len 2 is the least check_sizes allows: a shorter stream cannot fit any seq_len
    lower = f"Lower seq_len to at most {length}, or save" if length >= 2 else "Save"
    return DataError(
        f"{description} holds no usable sample: its token stream has {length} tokens, fewer "
        f"than seq_len={seq_len}",
        hint=f"{lower} a longer token stream.",
        source=description,
    )


def take_windows(array: np.ndarray, indices: np.ndarray, seq_len: int) -> np.ndarray:
    """Return windows `indices` of `array` as an int64 array of shape `(len(indices), seq_len)`."""
    if array.ndim == 2:
        windows = array[indices, :seq_len]
    else:
        starts = indices * seq_len
        windows = array[starts[:, None] + np.arange(seq_len)]  # (N, seq_len)
    return np.asarray(windows, dtype=np.int64)


def check_token_range(
    ids: np.ndarray | torch.Tensor, vocab_size: int | None, description: str
) -> None:
    """Raise if a token id is negative or, when `vocab_size` (the rows of the model's embedding
    table) is known, not below it: an embedding lookup would fail deep inside the model, or
    a gather read memory that is not the model's."""
    if 0 in tuple(ids.shape):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        limit = f"[0, {vocab_size})" if vocab_size is not None else "non-negative"
        raise DataError(
            f"{description} holds token ids from {low} to {high}, outside {limit}",
            hint="Make the ids with this model's own tokenizer: each indexes a row of its "
            "embedding table.",
            source=description,
        )
