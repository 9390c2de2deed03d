"""Fixtures for the calibration-data tests: the refmodel tokenizer and small source files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow
import pyarrow.parquet
import pytest

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "Calibration data decides what a compressor sees.",
    "import os",
    "class Point:\n    x: int\n    y: int\n",
    "for i in range(10):\n    print(i)\n",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="session")
def tokenizer(refmodel_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(refmodel_dir)


# One line each, so that every format (a .txt file holds one text per line) carries the same texts.
LINES = [
    "def add(a, b): return a + b",
    "Calibration data decides what a compressor sees.",
    "import os",
    "class Point: x: int; y: int",
    "for i in range(10): print(i)",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture
def write_records(tmp_path: Path):
    """Write `records` (a list of dicts) as `<name>.<kind>` in tmp_path and return its path."""

    def write(kind: str, records: list[dict], name: str = "data") -> Path:
        path = tmp_path / f"{name}.{kind}"
        if kind == "jsonl":
            path.write_text("".join(json.dumps(record) + "\n" for record in records))
        elif kind == "json":
            path.write_text(json.dumps(records))
        elif kind == "parquet":
            pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), path)
        elif kind == "txt":
            path.write_text("".join(record["text"] + "\n" for record in records))
        else:
            raise AssertionError(f"no writer for {kind}")
        return path

    return write


@pytest.fixture
def texts() -> list[str]:
    """Short texts, some spanning several lines, as in a .jsonl of code and prose."""
    return list(TEXTS)


@pytest.fixture
def lines() -> list[str]:
    """Texts of one line each, writable in every format."""
    return list(LINES)
