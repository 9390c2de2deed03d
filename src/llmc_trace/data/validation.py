"""Check a calibration source cheaply, before a model is loaded or any text is tokenised.

`validate_source` answers "can this source give `samples` samples of `seq_len` tokens?" as far
as that is knowable from file headers, table columns and row counts, so that a command line can
reject a bad `--dataset` with exit code 2 in well under a second. What needs tokenising (how many
packed windows a text corpus fills) is checked by `load_calibration`, which tokenises only until
it has enough samples, still before any model work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmc_trace.errors import DataError
from llmc_trace.data.hub import read_hub_metadata
from llmc_trace.data.source import ResolvedSource, resolve_source
from llmc_trace.data.tables import read_text_table
from llmc_trace.data.saved import read_saved_table
from llmc_trace.data.texts import choose_text_column
from llmc_trace.data.tokens import count_windows, open_token_array


@dataclass(frozen=True)
class SourceInfo:
    """What a cheap look at a calibration source found.

    `num_records` counts table rows, array rows or stream windows (None where the Hub does not
    say). `max_samples` bounds the samples the source can give without tokenising: exact for a
    token array, the row count when truncating texts (empty texts are skipped later), and None
    when packing texts, which only tokenising can count.
    """

    kind: str
    description: str
    num_records: int | None
    columns: tuple[str, ...]
    text_column: str | None
    max_samples: int | None


def validate_source(
    source: str | Path,
    *,
    samples: int,
    seq_len: int,
    pack: bool = True,
    split: str = "train",
    subset: str | None = None,
    column: str | None = None,
) -> SourceInfo:
    """Check existence, type, text column and sample count of `source`; raise `DataError` if bad.

    Reads file headers and rows but never tokenises; for a Hub dataset it reads only the
    dataset's metadata. The arguments mean what they mean for `load_calibration`.

    Example::

        >>> try:
        ...     validate_source("missing.jsonl", samples=8, seq_len=512)
        ... except DataError as err:
        ...     print(err.message)
        data file missing.jsonl does not exist
    """
    check_sizes(samples=samples, seq_len=seq_len, batch_size=1)
    resolved = resolve_source(source)
    if resolved.is_token_array:
        info = _inspect_token_array(resolved, seq_len)
    else:
        info = _inspect_text_source(resolved, pack=pack, split=split, subset=subset, column=column)
    if info.max_samples is not None:
        check_enough(
            info.max_samples, samples=samples, seq_len=seq_len, description=info.description
        )
    return info


def check_sizes(*, samples: int, seq_len: int, batch_size: int) -> None:
    """Raise `DataError` unless the requested sizes are positive (seq_len at least 2)."""
    # seq_len 2 is the least that gives a model one next-token prediction to calibrate on.
    limits = (("samples", samples, 1), ("seq_len", seq_len, 2), ("batch_size", batch_size, 1))
    for name, value, least in limits:
        if value < least:
            raise DataError(
                f"{name} must be at least {least}, got {value}",
                hint=f"Pass {name} >= {least}.",
                param=name,
            )


def check_enough(available: int, *, samples: int, seq_len: int, description: str) -> None:
    """Raise `DataError`, saying how many there are, if `available < samples`."""
    if available < samples:
        raise DataError(
            f"{description} gives only {available} samples of {seq_len} tokens, fewer than "
            f"the {samples} asked for",
            hint=f"Ask for at most {available} samples, or use a larger source.",
            source=description,
            param="samples",
        )


def _inspect_token_array(resolved: ResolvedSource, seq_len: int) -> SourceInfo:
    assert resolved.path is not None
    array = open_token_array(resolved.path, resolved.description)
    windows = count_windows(array, seq_len, resolved.description)
    return SourceInfo(
        kind=resolved.kind,
        description=resolved.description,
        num_records=windows,
        columns=(),
        text_column=None,
        max_samples=windows,
    )


def _inspect_text_source(
    resolved: ResolvedSource, *, pack: bool, split: str, subset: str | None, column: str | None
) -> SourceInfo:
    if resolved.hub_id is not None:
        metadata = read_hub_metadata(resolved.hub_id, split=split, subset=subset)
        columns, num_rows = metadata.columns, metadata.num_rows
    elif resolved.kind in ("disk", "arrow"):
        assert resolved.path is not None
        table = read_saved_table(resolved.path, resolved.kind, resolved.description, split=split)
        columns, num_rows = table.columns, table.num_rows
    else:
        assert resolved.path is not None
        table = read_text_table(resolved.path, resolved.kind, resolved.description)
        columns, num_rows = table.columns, table.num_rows
    # A Hub card may not declare its columns; then load_calibration checks them after download.
    text_column = (
        choose_text_column(columns, column, description=resolved.description) if columns else None
    )
    return SourceInfo(
        kind=resolved.kind,
        description=resolved.description,
        num_records=num_rows,
        columns=columns,
        text_column=text_column,
        max_samples=None if pack else num_rows,
    )
