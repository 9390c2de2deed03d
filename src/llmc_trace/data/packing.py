"""Turn a stream of tokenised texts into calibration samples of at most `seq_len` tokens.

Two ways, as calibration recipes differ:

* packing (`pack_texts`): texts are joined into one stream, each followed by the eos token as in
  the refmodel's training stream, and the stream is cut into full windows of `seq_len`. No
  sample needs padding, and no token is wasted, but a window may span several texts.
* truncation (`truncate_texts`): one sample per text, its first `seq_len` tokens. A sample
  starts where a text starts, at the cost of padding short texts.

Both consume their input lazily and stop once `samples` are made, so a large corpus is only
tokenised as far as needed. Both raise `DataError` with the count found when the input runs
out first.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmc_trace.errors import DataError


def pack_texts(
    token_lists: Iterable[list[int]],
    *,
    seq_len: int,
    eos_id: int,
    samples: int,
    description: str,
    up_to: bool = False,
) -> list[list[int]]:
    """Cut `t1 eos t2 eos ...` into the first `samples` full windows of `seq_len` tokens; with
    `up_to`, a stream shorter than that gives every full window and its shorter rest."""
    windows: list[list[int]] = []
    stream: list[int] = []
    for tokens in token_lists:
        if not tokens:
            continue  # an empty text would only add a second separator
        stream.extend(tokens)
        stream.append(eos_id)
        start = 0  # cut every full window of this text, then drop them once (linear time)
        while len(stream) - start >= seq_len and len(windows) < samples:
            windows.append(stream[start : start + seq_len])
            start += seq_len
        del stream[:start]
        if len(windows) == samples:
            return windows
    if up_to and (windows or len(stream) >= 2):
        return windows + ([stream] if len(stream) >= 2 else [])
    if not stream and not windows:
        raise _no_text(description)
    if not windows:
        raise DataError(
            f"{description} holds no usable sample: its texts make {len(stream)} tokens in all "
            f"(an eos after each), fewer than seq_len={seq_len}",
            hint=f"Lower seq_len to at most {len(stream)}, or use a larger source.",
            source=description,
        )
    raise DataError(
        f"{description} packs into only {len(windows)} windows of {seq_len} tokens, "
        f"fewer than the {samples} samples asked for",
        hint=f"Ask for at most {len(windows)} samples, lower seq_len, or use a larger source.",
        source=description,
        param="samples",
    )


def truncate_texts(
    token_lists: Iterable[list[int]],
    *,
    seq_len: int,
    samples: int,
    description: str,
) -> list[list[int]]:
    """Keep the first `seq_len` tokens of each of the first `samples` non-empty texts."""
    kept: list[list[int]] = []
    for tokens in token_lists:
        if tokens:
            kept.append(tokens[:seq_len])
            if len(kept) == samples:
                return kept
    if not kept:
        raise _no_text(description)
    raise DataError(
        f"{description} has only {len(kept)} non-empty texts, fewer than the {samples} "
        "samples asked for",
        hint=f"Ask for at most {len(kept)} samples, or pack texts into windows instead.",
        source=description,
        param="samples",
    )


def _no_text(description: str) -> DataError:
    """The error for a source none of whose rows has text, which gives no sample at any size
    (advice to ask for fewer samples would mean none)."""
    return DataError(
        f"{description} holds no usable sample: none of its rows has any text (every text read "
        "is empty or null)",
        hint="Fill its text column, or name the column that holds the text with --text-column.",
        source=description,
    )
