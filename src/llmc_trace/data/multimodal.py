"""Load image, video or audio calibration rows into batches a multimodal model takes.

The steps: read the table (`tables`), decide its modality (`rows.detect_modality`), visit its
rows in an order drawn from the seed, read each row's media (`media`), lay the row out with the
processor's chat template, and preprocess it with the model's own processor (`processor`),
which expands each image marker into as many placeholder tokens as the vision tower gives
embeddings. The template's markers are counted against the row's media before the processor
runs, so a template that drops or repeats a marker (one that does not recognise the rows'
media parts) is named in one sentence instead of failing inside the processor. Then each
sample is fitted to `seq_len` (`fitting`), and the kept rows are
preprocessed again as batches, so that the media tensors are collated as the processor
collates them for the model (Qwen2-VL's patches of differently sized images concatenated with
one `image_grid_thw` row each, Idefics3's tiles padded per row, audio features stacked).

The same arguments give the same batches: the order comes from `numpy.random.default_rng(seed)`
and nothing else is random.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmc_trace.core.progress import Progress
from llmc_trace.data.calibration import CalibrationSet, open_table, visiting_order
from llmc_trace.data.columns import Columns
from llmc_trace.data.fitting import TokenFit, fit_tokens, protected_mask
from llmc_trace.data.processor import LoadedProcessor, load_processor
from llmc_trace.data.rows import MediaRow, ModalityChoice, RowReader, detect_modality, has_media
from llmc_trace.data.source import ResolvedSource, resolve_source
from llmc_trace.data.tokens import check_token_range
from llmc_trace.data.validation import check_sizes
from llmc_trace.errors import DataError

#: Per-token tensors: right-padded, and cut where the text is shortened. Every other tensor a
#: processor returns describes the media and is collated by the processor itself.
TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
TABLE_KINDS = ("jsonl", "json", "parquet", "disk", "arrow", "hub")
#: The share of the rows visited that must fit `seq_len`: below it, dropping rows whose media
#: alone are too long would calibrate on an unrepresentative few, and the data is refused.
MIN_KEPT_SHARE = 0.5


@dataclass(frozen=True)
class BatchStats:
    """What one batch holds: `num_tokens` real tokens of which `placeholder_tokens` stand for
    media, `media_items` images (videos, audio clips), and every tensor's shape."""

    num_samples: int
    num_tokens: int
    placeholder_tokens: int
    media_items: int
    shapes: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class MultimodalCalibrationSet(CalibrationSet):
    """A `CalibrationSet` whose batches also hold the processor's media tensors.

    Each batch holds `input_ids` and `attention_mask` (`(B, T)`, right-padded, `T <= seq_len`)
    and whatever else the model's processor returns (`pixel_values`, `image_grid_thw`,
    `mm_token_type_ids`, `input_features`, ...), ready for `model(**batch)`. `modality` is the
    one calibrated with and `modality_reason` what decided it (a column, or forced);
    `placeholder_ids` the token ids standing for media of any modality the model takes (never
    scored by `evaluate`), `media_token_id` the one of `modality`.
    `shortened` samples lost text to fit `seq_len`; `dropped` rows could not fit without
    cutting media tokens and were skipped (`notes` says how many, and why). `processor_built_from` says how the processor was
    loaded (`"AutoProcessor"` or `"parts"`).
    """

    modality: str
    modality_reason: str
    placeholder_ids: tuple[int, ...]
    media_token_id: int
    batch_stats: tuple[BatchStats, ...]
    shortened: int
    dropped: int
    processor_built_from: str


def load_multimodal_calibration(
    source: str | Path,
    model: str | Path | LoadedProcessor,
    *,
    samples: int | None,
    seq_len: int,
    seed: int = 0,
    batch_size: int = 1,
    modality: str | None = None,
    shuffle: bool = True,
    progress: Progress | None = None,
    vocab_size: int | None = None,
    columns: Columns | None = None,
    split: str = "train",
) -> MultimodalCalibrationSet:
    """Take `samples` rows of `source` through `model`'s processor into batches (`None`:
    every row that fits, each text of a list counted when `columns` reads lists as rows).

    `source` is a `.jsonl`, `.json` or `.parquet` file, a `save_to_disk` folder or `.arrow`
    file, or a Hub dataset id (`split`), whose rows hold media and text (the layouts are in
    `data.rows`; media paths are relative to the file, or the folder). `columns` names the
    text, image or audio column and says how a list of captions is read. `model` is the model
    folder (its processor is loaded with `load_processor`) or an already loaded processor.
    `modality` forces image, video or audio; by default the columns decide. A sample longer
    than `seq_len` loses text from its end, never a media token (`data.fitting`); one that
    cannot fit is dropped and counted. `progress` hears `("rows", kept, samples)` as rows are
    read and fitted, then `("batches", done, total)`. With `vocab_size` (the rows of the
    model's embedding table) every token id, placeholders included, must lie below it.

    Raises `DataError` for a bad source, a bad row (naming it), a chat template whose media
    markers do not match a row's media, a processor that refuses a row (naming it), a model
    that does not take the modality, too many rows whose media alone exceed `seq_len`, token
    ids outside the vocabulary, and too few samples.

    Example::

        >>> import tempfile
        >>> from llmc_trace.data.drawn import write_drawn_dataset
        >>> from llmc_trace.twins.save import save_twin
        >>> folder = save_twin("Qwen/Qwen2-VL-2B-Instruct", tempfile.mkdtemp())
        >>> rows = write_drawn_dataset(tempfile.mkdtemp(), count=4)
        >>> calib = load_multimodal_calibration(rows, folder, samples=4, seq_len=128, batch_size=2)
        >>> calib.modality, sorted(calib.batches[0])[:3]
        ('image', ['attention_mask', 'image_grid_thw', 'input_ids'])
    """
    check_sizes(samples=1 if samples is None else samples, seq_len=seq_len, batch_size=batch_size)
    resolved = resolve_source(source)
    if resolved.kind not in TABLE_KINDS:
        raise _not_a_media_table(resolved)
    table = open_table(resolved, split=split)
    choice = detect_modality(table, modality, columns)
    loaded = model if isinstance(model, LoadedProcessor) else load_processor(model, choice.modality)
    loaded.require(choice.modality)
    encoder = _Encoder(loaded, choice.modality)
    reader = RowReader(
        table, choice, base=_media_base(resolved), target_rate=encoder.sampling_rate,
        columns=columns,
    )  # fmt: skip
    kept, shortened, dropped = _fitted_rows(
        reader, encoder, table.num_rows, samples=samples, seq_len=seq_len,
        seed=seed if shuffle else None, description=table.description, progress=progress,
    )  # fmt: skip
    notes = list(reader.notes)
    if dropped:
        notes.append(
            f"{dropped} rows dropped: their media and the special tokens around them take more "
            f"than seq_len={seq_len} tokens"
        )
    batches, stats = [], []
    total = -(-len(kept) // batch_size)
    for first in range(0, len(kept), batch_size):
        chunk = kept[first : first + batch_size]
        batch = encoder.batch(chunk, table.description)
        check_token_range(batch["input_ids"], vocab_size, table.description)
        batches.append(batch)
        if progress is not None:
            progress("batches", len(batches), total)
        media_token = loaded.placeholder_ids[choice.modality]
        stats.append(_stats(batch, media_token, sum(_items(row) for row, _ in chunk)))
    return MultimodalCalibrationSet(
        batches=batches,
        num_samples=len(kept),
        seq_len=seq_len,
        num_tokens=sum(s.num_tokens for s in stats),
        source=table.description,
        seed=seed,
        modality=choice.modality,
        modality_reason=choice.reason,
        placeholder_ids=encoder.placeholders,
        media_token_id=loaded.placeholder_ids[choice.modality],
        batch_stats=tuple(stats),
        shortened=shortened,
        dropped=dropped,
        processor_built_from=loaded.built_from,
        notes=(*notes, _seen(stats)),
    )


def source_modality(
    source: str | Path, modality: str | None = None, columns: Columns | None = None
) -> ModalityChoice | None:
    """The media modality calibration rows in `source` hold, or None for text-only data.

    This is the cheap routing question a command line asks before any model is loaded: None
    means `load_calibration` reads the source (a `.npy` array, a `.txt` file, a Hub dataset, a
    table without media columns), a choice means `load_multimodal_calibration` does. A forced
    `modality` the source cannot hold is refused (`DataError`), as in the loader; `"text"`
    forces None. A Hub dataset is read for media only when `modality` forces one or `columns`
    names a media column (its columns are not known before it is downloaded).

    Example::

        >>> import tempfile
        >>> from llmc_trace.data.drawn import write_drawn_dataset
        >>> source_modality(write_drawn_dataset(tempfile.mkdtemp(), count=1)).reason
        "image (column 'image')"
    """
    if modality == "text":
        return None
    resolved = resolve_source(source)
    names_media = columns is not None and (columns.image or columns.audio)
    if resolved.kind == "hub" and modality is None and not names_media:
        return None
    if resolved.kind not in TABLE_KINDS:
        if modality is None:
            return None
        raise _not_a_media_table(resolved)
    table = open_table(resolved)
    if modality is None and not has_media(table, columns):
        return None
    return detect_modality(table, modality, columns)


def _media_base(resolved: ResolvedSource) -> Path:
    """The folder relative media paths start from: the data file's, a saved dataset's own."""
    if resolved.path is None:
        return Path.cwd()
    return resolved.path if resolved.kind == "disk" else resolved.path.parent


def _seen(stats: list[BatchStats]) -> str:
    """The line saying what calibration will see, in tokens (media placeholders among them)."""
    tokens = sum(s.num_tokens for s in stats)
    media = sum(s.placeholder_tokens for s in stats)
    samples = sum(s.num_samples for s in stats)
    return (
        f"{samples} samples, {tokens} tokens ({media} of them media placeholders, "
        f"{tokens // max(samples, 1)} tokens a sample on average)"
    )


def _not_a_media_table(resolved: ResolvedSource) -> DataError:
    return DataError(
        f"calibration source {resolved.description} cannot hold images, video or audio",
        hint="Give a .jsonl, .json or .parquet file of rows with media and text, a folder "
        "datasets' save_to_disk wrote, a .arrow file, or a Hub dataset id.",
        source=resolved.description,
    )


def _fitted_rows(
    reader: RowReader,
    encoder: _Encoder,
    num_rows: int,
    *,
    samples: int | None,
    seq_len: int,
    seed: int | None,
    description: str,
    progress: Progress | None,
) -> tuple[list[tuple[MediaRow, TokenFit]], int, int]:
    """The first `samples` rows (in visiting order; `None`: all of them) that fit `seq_len`,
    with their fits, and the counts of rows shortened and dropped on the way. Too few rows
    kept, or fewer than `MIN_KEPT_SHARE` of those visited, is a `DataError` naming the longest
    media seen."""
    kept: list[tuple[MediaRow, TokenFit]] = []
    shortened = dropped = largest = 0
    first_dropped = ""
    for row in visiting_order(num_rows, seed):
        for media_row in reader.read(int(row)):
            ids = encoder.encode([media_row], description)["input_ids"][0]
            placeholders = ids == encoder.media_token_id
            fit = fit_tokens(
                ids, protected_mask(ids, encoder.protected), placeholders, seq_len=seq_len
            )
            if fit is None:
                dropped += 1
                largest = max(largest, int(placeholders.sum()))
                first_dropped = first_dropped or media_row.where
                continue
            shortened += fit.shortened
            kept.append((media_row, fit))
            if progress is not None:
                progress("rows", len(kept), samples or max(num_rows, len(kept)))
            if len(kept) == samples:
                break
        if len(kept) == samples:
            break
    if len(kept) < MIN_KEPT_SHARE * (len(kept) + dropped):
        raise DataError(
            f"{dropped} of the {len(kept) + dropped} rows read do not fit seq_len={seq_len} "
            f"(first {first_dropped}: its media take {largest} placeholder tokens alone, "
            f"more than seq_len={seq_len} with the tokens around them)",
            hint=f"Raise seq_len above {largest}, or use smaller or fewer images (the "
            "processor's max_pixels or image size bounds the tokens per image).",
            source=description,
            param="seq_len",
        )
    if samples is not None and len(kept) < samples:
        # each media row is one sample: a longer seq_len only helps when rows were dropped
        why = (
            f" ({dropped} rows dropped: their text and special tokens around the media do not fit)"
            if dropped
            else ""
        )
        longer = ", raise seq_len" if dropped else ""
        raise DataError(
            f"{description} gives only {len(kept)} samples of at most {seq_len} tokens, fewer "
            f"than the {samples} asked for{why}",
            hint=f"Ask for at most {len(kept)} samples{longer}, or use more rows (each media "
            "row is one sample).",
            source=description,
            param="samples",
        )
    return kept, shortened, dropped


class _Encoder:
    """Lays rows out with the chat template and preprocesses them with the processor."""

    def __init__(self, loaded: LoadedProcessor, modality: str) -> None:
        self.processor = loaded.processor
        self.modality = modality
        self.placeholders = tuple(sorted(loaded.placeholder_ids.values()))
        self.media_token_id = loaded.placeholder_ids[modality]
        tokenizer = loaded.tokenizer
        specials = set(tokenizer.all_special_ids)
        specials |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
        self.protected = tuple(sorted(specials | set(self.placeholders)))
        self.pad_id = next(
            (i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0
        )
        extractor = getattr(self.processor, "feature_extractor", None)
        self.sampling_rate: int | None = getattr(extractor, "sampling_rate", None)

    def encode(self, rows: list[MediaRow], source: str) -> dict[str, torch.Tensor]:
        """The processor's output for `rows`, right-padded to the longest; `DataError` naming
        the row when the template's markers do not match its media, or the processor refuses
        it."""
        texts = [self._text(row, source) for row in rows]
        kwargs: dict[str, Any] = {"text": texts}
        if self.modality == "image":
            kwargs["images"] = [row.images for row in rows]
        elif self.modality == "video":
            kwargs["videos"] = [video for row in rows for video in row.videos]
        else:
            kwargs["audio"] = [audio for row in rows for audio in row.audios]
            kwargs["sampling_rate"] = self.sampling_rate
        try:
            output = self.processor(
                **kwargs, padding=True, padding_side="right", return_tensors="pt"
            )
        except (ValueError, TypeError, IndexError, KeyError, RuntimeError) as err:
            where = "; ".join(row.where for row in rows)
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(
                f"{where}: the model's processor refuses the row ({first_line})",
                hint="Check the row's media and text, and that the model folder's processor "
                "files and chat template are the published ones.",
                source=source,
            ) from err
        return {k: v for k, v in output.items() if isinstance(v, torch.Tensor)}

    def batch(self, chunk: list[tuple[MediaRow, TokenFit]], source: str) -> dict[str, torch.Tensor]:
        """One batch of fitted rows: preprocessed together, then each row's tokens cut to its
        fit and padded again."""
        encoded = self.encode([row for row, _ in chunk], source)
        width = max(len(fit.keep) for _, fit in chunk)
        batch = {k: v for k, v in encoded.items() if k not in TOKEN_KEYS}
        for key in (k for k in TOKEN_KEYS if k in encoded):
            fill = self.pad_id if key == "input_ids" else 0
            padded = torch.full((len(chunk), width), fill, dtype=encoded[key].dtype)
            for index, (_, fit) in enumerate(chunk):
                padded[index, : len(fit.keep)] = encoded[key][index, fit.keep]
            batch[key] = padded
        for index, (_, fit) in enumerate(chunk):
            # a row preprocessed in a batch is the row preprocessed alone, then padded
            assert torch.equal(batch["input_ids"][index, : len(fit.keep)], fit.input_ids)
        return batch

    def _text(self, row: MediaRow, source: str) -> str:
        marker = getattr(self.processor, f"{self.modality}_token", None) or ""
        if getattr(self.processor, "chat_template", None):
            text = self.processor.apply_chat_template(row.messages, tokenize=False)
            check_markers(text, marker, _items(row), self.modality, where=row.where, source=source)
            return text
        lines = []
        for message in row.messages:
            content = message["content"]
            if isinstance(content, list):
                content = "".join(
                    part["text"] if part["type"] == "text" else marker for part in content
                )
            lines.append(f"{message['role']}: {content}")
        return "\n".join(lines)


def check_markers(
    text: str, marker: str, items: int, modality: str, *, where: str, source: str
) -> None:
    """Raise `DataError` unless the templated `text` holds one `marker` per media item: a
    template that does not recognise the rows' media parts renders none (or too many), and
    the processor would then fail, or misplace the embeddings, far from the cause."""
    if not marker:
        return
    found = text.count(marker)
    if found != items:
        raise DataError(
            f"{where}: the model's chat template wrote {found} {modality} marker(s) "
            f"({marker}) for the row's {items} {modality} item(s)",
            hint=f"The chat template does not lay out {{'type': '{modality}'}} parts; use the "
            "published chat_template.jinja or chat_template.json of the checkpoint.",
            source=source,
        )


def _items(row: MediaRow) -> int:
    return len(row.images) + len(row.videos) + len(row.audios)


def _stats(batch: dict[str, torch.Tensor], media_token_id: int, media_items: int) -> BatchStats:
    real = batch["attention_mask"].bool()
    media = (batch["input_ids"] == media_token_id) & real
    return BatchStats(
        num_samples=int(batch["input_ids"].shape[0]),
        num_tokens=int(real.sum()),
        placeholder_tokens=int(media.sum()),
        media_items=media_items,
        shapes={key: tuple(value.shape) for key, value in sorted(batch.items())},
    )
