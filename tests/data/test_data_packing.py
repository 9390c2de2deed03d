"""Packing and truncation of texts: exact tokens, order, seeds, masks and sample counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmc_trace.data import DataError, load_calibration, validate_source


def _stream(texts: list[str], tokenizer) -> list[int]:
    """The documented packing stream: each text's tokens followed by eos."""
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return stream


def _all_ids(calib) -> torch.Tensor:
    return torch.cat([batch["input_ids"] for batch in calib.batches])


def test_packing_cuts_the_eos_joined_stream_into_full_windows(
    write_records, texts: list[str], tokenizer
) -> None:
    path = write_records("jsonl", [{"text": text} for text in texts])
    seq_len = 7
    stream = _stream(texts, tokenizer)
    samples = len(stream) // seq_len
    calib = load_calibration(
        path, tokenizer, samples=samples, seq_len=seq_len, shuffle=False, batch_size=4
    )
    expected = [stream[k * seq_len : (k + 1) * seq_len] for k in range(samples)]
    assert _all_ids(calib).tolist() == expected
    assert all(batch["attention_mask"].eq(1).all() for batch in calib.batches)
    assert [batch["input_ids"].shape[0] for batch in calib.batches] == [4] * (samples // 4) + (
        [samples % 4] if samples % 4 else []
    )
    assert calib.num_tokens == samples * seq_len and calib.num_samples == samples


def test_shuffled_packing_visits_texts_in_the_seeded_order(
    write_records, texts: list[str], tokenizer
) -> None:
    path = write_records("jsonl", [{"text": text} for text in texts])
    order = np.random.default_rng(5).permutation(len(texts))  # the documented visiting order
    stream = _stream([texts[i] for i in order], tokenizer)
    calib = load_calibration(path, tokenizer, samples=3, seq_len=8, seed=5)
    assert _all_ids(calib).tolist() == [stream[0:8], stream[8:16], stream[16:24]]
    assert calib.seed == 5


def test_seeds_reproduce_and_differ(write_records, texts: list[str], tokenizer) -> None:
    path = write_records("jsonl", [{"text": text} for text in texts])

    def load(seed: int, pack: bool) -> list[list[list[int]]]:
        calib = load_calibration(path, tokenizer, samples=4, seq_len=8, seed=seed, pack=pack)
        return [
            batch["input_ids"].tolist() + batch["attention_mask"].tolist()
            for batch in calib.batches
        ]

    for pack in (True, False):
        assert load(0, pack) == load(0, pack)
        assert load(0, pack) != load(1, pack)


def test_truncation_keeps_the_first_seq_len_tokens_of_each_text(
    write_records, texts: list[str], tokenizer
) -> None:
    path = write_records("json", [{"text": text} for text in texts])
    calib = load_calibration(
        path, tokenizer, samples=len(texts), seq_len=5, pack=False, shuffle=False, batch_size=2
    )
    expected = [tokenizer(text, add_special_tokens=False)["input_ids"][:5] for text in texts]
    rows = [
        ids[mask.bool()].tolist()
        for batch in calib.batches
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
    ]
    assert rows == expected
    assert calib.num_tokens == sum(len(tokens) for tokens in expected)


def test_packing_too_few_windows_says_how_many_there_are(
    write_records, texts: list[str], tokenizer
) -> None:
    path = write_records("jsonl", [{"text": text} for text in texts])
    available = len(_stream(texts, tokenizer)) // 16
    with pytest.raises(DataError, match=f"packs into only {available} windows of 16") as caught:
        load_calibration(path, tokenizer, samples=available + 1, seq_len=16)
    assert f"at most {available} samples" in caught.value.hint


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("texts", [[""], [None, None], [None, ""]])
def test_rows_without_text_say_so_not_ask_for_zero(
    write_records, texts: list[str | None], pack: bool, tokenizer
) -> None:
    path = write_records("jsonl", [{"text": text} for text in texts])
    for up_to in (False, True) if pack else (False,):
        with pytest.raises(DataError) as caught:
            load_calibration(path, tokenizer, samples=1, seq_len=8, pack=pack, up_to=up_to)
        assert caught.value.message == (
            f"{path} holds no usable sample: none of its rows has any text (every text read "
            "is empty or null)"
        )
        assert "--text-column" in caught.value.hint


def test_text_shorter_than_one_window_says_how_long_it_is(write_records, tokenizer) -> None:
    path = write_records("txt", [{"text": "hi"}])
    tokens = len(_stream(["hi"], tokenizer))
    with pytest.raises(DataError) as caught:
        load_calibration(path, tokenizer, samples=2, seq_len=tokens + 1)
    assert caught.value.message == (
        f"{path} holds no usable sample: its texts make {tokens} tokens in all (an eos after "
        f"each), fewer than seq_len={tokens + 1}"
    )
    assert f"Lower seq_len to at most {tokens}" in caught.value.hint


class _RefusingTokenizer:
    """A tokenizer that fails the test if anything is tokenised."""

    eos_token_id = 0
    pad_token_id = 0
    chat_template = None

    def __call__(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("tokenised although the sample count was already known to be short")


def test_truncation_too_few_texts_fails_before_tokenising(write_records, lines: list[str]) -> None:
    path = write_records("txt", [{"text": line} for line in lines])
    with pytest.raises(DataError, match=f"gives only {len(lines)} samples") as caught:
        load_calibration(path, _RefusingTokenizer(), samples=len(lines) + 1, seq_len=8, pack=False)
    assert f"at most {len(lines)} samples" in caught.value.hint
    with pytest.raises(DataError, match=f"gives only {len(lines)} samples"):
        validate_source(path, samples=len(lines) + 1, seq_len=8, pack=False)
    # Packing cannot be counted without tokenising, so the cheap check leaves it to loading.
    assert validate_source(path, samples=len(lines) + 1, seq_len=8).max_samples is None


def test_tokenizer_without_eos_cannot_pack(write_records, lines: list[str]) -> None:
    class NoEos(_RefusingTokenizer):
        eos_token_id = None

    path = write_records("jsonl", [{"text": line} for line in lines])
    with pytest.raises(DataError, match="no eos token") as caught:
        load_calibration(path, NoEos(), samples=1, seq_len=8)
    assert "pack=False" in caught.value.hint
