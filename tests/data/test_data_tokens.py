"""Token arrays (.npy) and synthetic batches: rows and windows come back exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from llmc_trace.data import (
    DataError,
    load_calibration,
    make_synthetic_text_batches,
    validate_source,
)


def _all_ids(calib) -> np.ndarray:
    return torch.cat([batch["input_ids"] for batch in calib.batches]).numpy()


def test_refmodel_calib_rows_round_trip_exactly(refmodel_dir: Path) -> None:
    path = refmodel_dir / "calib.npy"
    calib_rows = np.load(path)  # (256, 512) int32
    calib = load_calibration(path, samples=256, seq_len=512, shuffle=False, batch_size=32)
    assert np.array_equal(_all_ids(calib), calib_rows)
    assert all(batch["input_ids"].dtype == torch.long for batch in calib.batches)
    assert all(batch["attention_mask"].eq(1).all() for batch in calib.batches)
    assert (calib.num_samples, calib.seq_len, calib.num_tokens) == (256, 512, 256 * 512)

    shuffled = load_calibration(path, samples=10, seq_len=512, seed=3, batch_size=4)
    order = np.random.default_rng(3).permutation(256)[:10]  # the documented visiting order
    assert np.array_equal(_all_ids(shuffled), calib_rows[order])


def test_refmodel_tokens_are_checked_against_the_tokenizer(refmodel_dir: Path, tokenizer) -> None:
    calib = load_calibration(refmodel_dir / "eval.npy", tokenizer, samples=2, seq_len=512)
    assert int(_all_ids(calib).max()) < len(tokenizer)


def test_long_rows_keep_their_first_seq_len_tokens(tmp_path: Path) -> None:
    path = tmp_path / "rows.npy"
    rows = np.arange(5 * 12, dtype=np.int64).reshape(5, 12)
    np.save(path, rows)
    calib = load_calibration(path, samples=5, seq_len=8, shuffle=False, batch_size=2)
    assert np.array_equal(_all_ids(calib), rows[:, :8])


def test_short_rows_are_rejected_with_the_longest_usable_seq_len(tmp_path: Path) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, np.zeros((4, 6), dtype=np.int32))
    with pytest.raises(DataError, match="rows of 6 tokens, shorter than seq_len=8") as caught:
        validate_source(path, samples=1, seq_len=8)
    assert "seq_len <= 6" in caught.value.hint


def test_stream_is_cut_into_consecutive_windows(tmp_path: Path) -> None:
    path = tmp_path / "stream.npy"
    np.save(path, np.arange(30, dtype=np.int32))
    calib = load_calibration(path, samples=3, seq_len=8, shuffle=False, batch_size=3)
    assert _all_ids(calib).tolist() == [list(range(8)), list(range(8, 16)), list(range(16, 24))]
    info = validate_source(path, samples=3, seq_len=8)
    assert (info.num_records, info.max_samples) == (3, 3)
    with pytest.raises(DataError, match="gives only 3 samples of 8 tokens") as caught:
        load_calibration(path, samples=4, seq_len=8)
    assert "at most 3 samples" in caught.value.hint


@pytest.mark.parametrize(
    "array", [np.zeros((2, 3, 4), dtype=np.int32), np.zeros((2, 8), dtype=np.float32)]
)
def test_arrays_that_are_not_token_ids_are_rejected(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "bad.npy"
    np.save(path, array)
    with pytest.raises(DataError, match="not token ids") as caught:
        validate_source(path, samples=1, seq_len=2)
    assert "integer array" in caught.value.hint


def test_empty_file_is_named_as_not_an_array(tmp_path: Path) -> None:
    """numpy's EOFError for a file of zero bytes would end the command line as "Aborted!"."""
    path = tmp_path / "empty.npy"
    path.write_bytes(b"")
    with pytest.raises(DataError) as caught:
        validate_source(path, samples=1, seq_len=2)
    assert caught.value.message == (
        f"data file {path} is not a readable .npy array (the file is empty)"
    )
    assert "numpy.save" in caught.value.hint


@pytest.mark.parametrize(
    ("array", "why", "hint"),
    [
        (np.zeros((0, 8), dtype=np.int32), "its array has no rows", "at least one row"),
        (
            np.arange(5, dtype=np.int32),
            "its token stream has 5 tokens, fewer than seq_len=8",
            "Lower seq_len to at most 5",
        ),
        (np.arange(1, dtype=np.int32), "its token stream has 1 tokens", "Save a longer"),
    ],
)
def test_array_without_a_sample_says_why_not_ask_for_zero(
    tmp_path: Path, array: np.ndarray, why: str, hint: str
) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, array)
    for check in (
        lambda: validate_source(path, samples=2, seq_len=8),
        lambda: load_calibration(path, samples=2, seq_len=8),
    ):
        with pytest.raises(DataError, match=f"holds no usable sample: {why}") as caught:
            check()
        assert hint in caught.value.hint and "at most 0" not in caught.value.hint


def test_token_ids_outside_the_vocabulary_are_rejected(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, np.full((2, 8), len(tokenizer), dtype=np.int32))
    with pytest.raises(DataError, match=rf"outside \[0, {len(tokenizer)}\)"):
        load_calibration(path, tokenizer, samples=2, seq_len=8)


def test_synthetic_batches_are_seeded_uniform_tokens() -> None:
    calib = make_synthetic_text_batches(vocab_size=50, samples=5, seq_len=6, seed=7, batch_size=2)
    expected = np.random.default_rng(7).integers(0, 50, size=(5, 6))  # the documented draw
    assert np.array_equal(_all_ids(calib), expected)
    assert [batch["input_ids"].shape[0] for batch in calib.batches] == [2, 2, 1]
    assert all(batch["attention_mask"].eq(1).all() for batch in calib.batches)
    assert (calib.num_samples, calib.seq_len, calib.num_tokens) == (5, 6, 30)
    again = make_synthetic_text_batches(vocab_size=50, samples=5, seq_len=6, seed=7, batch_size=2)
    other = make_synthetic_text_batches(vocab_size=50, samples=5, seq_len=6, seed=8, batch_size=2)
    assert np.array_equal(_all_ids(again), expected)
    assert not np.array_equal(_all_ids(other), expected)
    with pytest.raises(DataError, match="vocab_size must be at least 1, got 0"):
        make_synthetic_text_batches(vocab_size=0, samples=1, seq_len=2, seed=0)
