"""Reading texts from .jsonl, .json, .parquet and .txt files: columns, chats and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmc_trace.data import DataError, load_calibration, validate_source


def _token_rows(calib) -> list[list[int]]:
    """The real (unpadded) tokens of every sample, in order."""
    rows = []
    for batch in calib.batches:
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
            rows.append(ids[mask.bool()].tolist())
    return rows


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "txt"])
def test_every_format_gives_the_texts_in_file_order(
    kind: str, write_records, lines: list[str], tokenizer
) -> None:
    path = write_records(kind, [{"text": line, "id": i} for i, line in enumerate(lines)])
    calib = load_calibration(
        path, tokenizer, samples=len(lines), seq_len=64, pack=False, shuffle=False
    )
    expected = [tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines]
    assert _token_rows(calib) == expected
    info = validate_source(path, samples=len(lines), seq_len=64, pack=False)
    assert (info.kind, info.text_column, info.num_records) == (kind, "text", len(lines))


def test_json_of_columns_reads_like_a_list_of_records(
    tmp_path: Path, lines: list[str], tokenizer
) -> None:
    path = tmp_path / "columns.json"
    path.write_text(json.dumps({"id": list(range(len(lines))), "text": lines}))
    calib = load_calibration(path, tokenizer, samples=2, seq_len=64, pack=False, shuffle=False)
    assert _token_rows(calib) == [
        tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines[:2]
    ]


@pytest.mark.parametrize("name", ["content", "prompt"])
def test_text_column_is_found_by_common_names(name: str, write_records, tokenizer) -> None:
    path = write_records("jsonl", [{"id": 1, name: "import os"}])
    calib = load_calibration(path, tokenizer, samples=1, seq_len=8, pack=False)
    assert _token_rows(calib) == [tokenizer("import os", add_special_tokens=False)["input_ids"]]


def test_named_column_wins_over_common_names(write_records, tokenizer) -> None:
    path = write_records("jsonl", [{"text": "import os", "body": "import sys"}])
    calib = load_calibration(path, tokenizer, samples=1, seq_len=8, pack=False, column="body")
    assert _token_rows(calib) == [tokenizer("import sys", add_special_tokens=False)["input_ids"]]


def test_no_text_column_lists_the_columns_found(write_records) -> None:
    path = write_records("parquet", [{"id": 1, "score": 0.5}])
    with pytest.raises(
        DataError, match=r"no text column \(columns found: 'id', 'score'\)"
    ) as caught:
        validate_source(path, samples=1, seq_len=8)
    assert "'text', 'caption', 'content', 'prompt', 'messages'" in caught.value.hint
    assert "--text-column" in caught.value.hint
    with pytest.raises(DataError, match=r"no column 'body' \(columns found: 'id', 'score'\)"):
        validate_source(path, samples=1, seq_len=8, column="body")


def test_chat_without_template_is_joined_as_role_lines(write_records, tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = write_records("jsonl", [{"messages": messages}])
    assert tokenizer.chat_template is None
    calib = load_calibration(path, tokenizer, samples=1, seq_len=32, pack=False)
    expected = tokenizer("user: hi\nassistant: hello", add_special_tokens=False)["input_ids"]
    assert _token_rows(calib) == [expected]


def test_chat_with_template_is_rendered_by_it(write_records, refmodel_dir: Path) -> None:
    from transformers import AutoTokenizer

    chat_tokenizer = AutoTokenizer.from_pretrained(refmodel_dir)
    chat_tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = write_records("parquet", [{"messages": messages}])
    calib = load_calibration(path, chat_tokenizer, samples=1, seq_len=32, pack=False)
    rendered = "<|user|>hi<|endoftext|><|assistant|>hello<|endoftext|>"
    expected = chat_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert _token_rows(calib) == [expected]
    assert expected.count(chat_tokenizer.eos_token_id) == 2  # the template's own separators


def test_non_text_values_are_named_by_row_and_column(write_records, tokenizer) -> None:
    path = write_records("jsonl", [{"text": "fine"}, {"text": 42}])
    with pytest.raises(DataError, match=r"row 1 of column 'text' holds the int 42"):
        load_calibration(path, tokenizer, samples=2, seq_len=8, pack=False, shuffle=False)


def test_null_texts_are_skipped_and_counted_in_the_notes(write_records, tokenizer) -> None:
    """A null is a missing text (as a record without the column reads), not a wrong value."""
    texts = [None, "import os", None, "def add(a, b): return a + b"]
    path = write_records("jsonl", [{"text": text} for text in texts])
    calib = load_calibration(path, tokenizer, samples=2, seq_len=64, pack=False, shuffle=False)
    assert _token_rows(calib) == [
        tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts[1::2]
    ]
    assert calib.notes == ("2 rows skipped: their 'text' is null (the first: row 0)",)


def test_damaged_parquet_is_named_as_unreadable(write_records, lines: list[str]) -> None:
    """pyarrow reports a damaged footer as a plain OSError, not one of its own errors."""
    path = write_records("parquet", [{"text": line} for line in lines])
    data = bytearray(path.read_bytes())
    data[-60:-8] = b"\xff" * 52  # the footer's metadata, before its length and magic
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as caught:
        validate_source(path, samples=1, seq_len=8)
    assert caught.value.message.startswith(
        f"data file {path} is not a readable parquet file ("
    )
    assert "parquet writer" in caught.value.hint


def test_malformed_files_name_the_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "a"}\n\n{"text": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl, line 3: not valid JSON") as caught:
        validate_source(jsonl, samples=1, seq_len=8)
    assert ".jsonl" in caught.value.hint
    records_per_line = tmp_path / "lines.json"
    records_per_line.write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=r"lines\.json, line 2: not valid JSON") as caught:
        validate_source(records_per_line, samples=1, seq_len=8)
    assert "name it .jsonl" in caught.value.hint
    not_a_table = tmp_path / "object.json"
    not_a_table.write_text('{"text": "a"}')
    with pytest.raises(DataError, match="neither a list of records"):
        validate_source(not_a_table, samples=1, seq_len=8)


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "txt"])
def test_a_file_without_rows_is_named_as_empty(kind: str, write_records) -> None:
    """Not reported as a missing text column: an empty file has no columns to look in."""
    path = write_records(kind, [])
    with pytest.raises(DataError, match=rf"{path.name} holds no rows") as caught:
        validate_source(path, samples=1, seq_len=8)
    assert "at least one record" in caught.value.hint


def test_truncation_skips_empty_texts_and_pads_right(write_records, tokenizer) -> None:
    texts = ["import os", None, "", "def add(a, b): return a + b"]
    path = write_records("jsonl", [{"text": text} for text in texts])
    calib = load_calibration(
        path, tokenizer, samples=2, seq_len=64, pack=False, shuffle=False, batch_size=2
    )
    first, second = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts[::3])
    batch = calib.batches[0]
    width = max(len(first), len(second))
    assert batch["input_ids"].shape == (2, width)
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["attention_mask"].tolist() == [
        [1] * len(first) + [0] * (width - len(first)),
        [1] * len(second) + [0] * (width - len(second)),
    ]
    pad = tokenizer.pad_token_id
    assert batch["input_ids"][0].tolist() == first + [pad] * (width - len(first))
    assert calib.num_tokens == len(first) + len(second) and calib.num_samples == 2
