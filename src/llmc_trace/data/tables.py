"""Read local text files (.jsonl, .json, .parquet, .txt) as tables of named columns.

A `TextTable` is the one shape every text source takes, local or Hub, so that choosing the text
column, shuffling and tokenising are written once. Reading a table never tokenises: it is the
cheap step that `validate_source` runs to check columns and counts early.

File conventions:

* `.jsonl`: one JSON object (or one JSON string, read as column `text`) per non-empty line.
* `.json`: a list of objects (or of strings), or an object of equally long column lists.
* `.parquet`: only the schema and row count are read until a column is asked for.
* `.txt`: one record per non-empty line in column `text`, as `datasets`' `text` loader splits
  files, except that empty lines are dropped (they would only add separators when packing).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmc_trace.errors import DataError


@dataclass(frozen=True)
class TextTable:
    """Rows of named columns, read lazily where the format allows it.

    `read_column(name)` returns a sequence indexable by row number; callers ask only for the
    column they use, so a wide parquet file costs one column's memory.
    """

    description: str
    columns: tuple[str, ...]
    num_rows: int
    read_column: Callable[[str], Sequence[object]]


def read_text_table(path: Path, kind: str, description: str) -> TextTable:
    """Open the local file `path` of type `kind` (its suffix without the dot) as a table.

    A table without rows is refused here, where the file can be named, rather than reported
    later as a missing column or too few samples."""
    if kind == "parquet":
        table = _read_parquet(path, description)
    else:
        table = _table_from_records(_read_records(path, kind, description), description)
    if table.num_rows == 0:
        raise DataError(
            f"data file {description} holds no rows",
            hint="Give a file with at least one record (one JSON object per "
            "line for .jsonl, one text per line for .txt).",
            source=description,
        )
    return table


def _read_records(path: Path, kind: str, description: str) -> list[object]:
    text = _read_utf8(path, description)
    if kind == "jsonl":
        return _parse_jsonl(text, description)
    if kind == "json":
        return _parse_json(text, description)
    if kind == "txt":
        return [{"text": line} for line in text.splitlines() if line.strip()]
    raise AssertionError(f"read_text_table called for non-text kind {kind!r}")


def _read_utf8(path: Path, description: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"data file {description} is not valid UTF-8 (byte {err.start})",
            hint="Re-encode the file as UTF-8.",
            source=description,
        ) from err


def _parse_jsonl(text: str, description: str) -> list[object]:
    records: list[object] = []
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(
                f"{description}, line {line_number}: not valid JSON ({err.msg})",
                hint="Each line of a .jsonl file must be one JSON object.",
                source=description,
            ) from err
    return records


def _parse_json(text: str, description: str) -> list[object]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{description}, line {err.lineno}: not valid JSON ({err.msg})",
            hint="If the file holds one JSON object per line, name it .jsonl.",
            source=description,
        ) from err
    if isinstance(document, list):
        return document
    if (
        isinstance(document, dict)
        and document
        and all(isinstance(value, list) for value in document.values())
    ):
        lengths = {len(value) for value in document.values()}
        if len(lengths) == 1:
            names = list(document)
            return [dict(zip(names, row, strict=True)) for row in zip(*document.values())]
    raise DataError(
        f"{description} is neither a list of records nor an object of equally long columns",
        hint='Write [{"text": ...}, ...] or {"text": [...]}.',
        source=description,
    )


def _table_from_records(records: list[object], description: str) -> TextTable:
    columns: dict[str, list[object]] = {}
    for row, record in enumerate(records):
        if isinstance(record, str):
            record = {"text": record}
        if not isinstance(record, dict):
            raise DataError(
                f"{description}, record {row}: a {type(record).__name__}, not an object",
                hint='Each record must be a JSON object such as {"text": ...}.',
                source=description,
            )
        for name in record:
            # A column first seen late is None in the rows before it.
            columns.setdefault(name, [None] * row)
        for name, values in columns.items():
            values.append(record.get(name))
    return TextTable(
        description=description,
        columns=tuple(columns),
        num_rows=len(records),
        read_column=columns.__getitem__,
    )


def _read_parquet(path: Path, description: str) -> TextTable:
    import pyarrow
    import pyarrow.parquet

    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as err:
        # resolve_source found the file readable, so an OSError here is pyarrow's word for a
        # damaged file ("Couldn't deserialize thrift")
        raise DataError(
            f"data file {description} is not a readable parquet file ({str(err).strip()})",
            hint="Check that the file was written completely by a parquet writer.",
            source=description,
        ) from err

    def read_column(name: str) -> list[object]:
        return parquet.read(columns=[name]).column(name).to_pylist()

    return TextTable(
        description=description,
        columns=tuple(parquet.schema_arrow.names),
        num_rows=parquet.metadata.num_rows,
        read_column=read_column,
    )
