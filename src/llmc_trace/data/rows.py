"""Turn a table row holding media and text into a chat conversation and its media.

Rows come in the layouts of captioning and chat datasets:

* `{"image": ..., "text": caption}` (also `caption`): the image is the user's turn and the
  caption the assistant's answer, as llm-compressor's captioning examples lay them out;
* `{"image": ..., "prompt": ..., "text": ...}`: the prompt joins the image in the user's turn;
* `{"messages": [...], "images": [...]}`: the Hub's chat layout, with `{"type": "image"}`
  parts standing for the row's images in order; a part may also carry its image itself
  (`{"type": "image", "image": "a.png"}`, llm-compressor's examples);

and the same with `video`/`videos` (frame lists) and `audio`/`audios` (waveforms). A media
column may hold one item or a list of items (several images per row). A caption column may
hold a list of captions (flickr30k, COCO captions): `data.columns.texts_of` decides which.
`Columns` names the text, image or audio column where the names above do not find it.

A media part keeps its media under its own key (`{"type": "audio", "audio": waveform}`), as
transformers' chat templating documents the layout: published templates recognise a part by
that key (Qwen2-Audio's by `'audio' in content`) or by its type, and a bare `{"type": "audio"}`
would render no marker at all.

`detect_modality` decides from the columns (and the part types of a messages column) which
modality a table holds, and says which column told it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmc_trace.data.columns import Columns, is_text_list, text_list_note, texts_of
from llmc_trace.data.media import read_audio, read_frames, read_image
from llmc_trace.data.tables import TextTable
from llmc_trace.errors import DataError

MEDIA_MODALITIES = ("image", "video", "audio")
#: Columns holding each modality's media, searched in this order.
MEDIA_COLUMNS: dict[str, tuple[str, ...]] = {
    "image": ("images", "image", "image_path", "image_bytes"),
    "video": ("videos", "video", "frames"),
    "audio": ("audios", "audio", "audio_path", "waveform"),
}
MESSAGES_COLUMNS = ("messages", "conversations")
#: Columns of the assistant's answer (a caption), and of the user's prompt.
ANSWER_COLUMNS = ("text", "caption", "answer", "response")
PROMPT_COLUMNS = ("prompt", "question", "instruction")
SAMPLING_RATE_COLUMNS = ("sampling_rate", "sample_rate", "sr")


@dataclass(frozen=True)
class ModalityChoice:
    """The modality a table holds and the column (or messages parts) that says so."""

    modality: str
    column: str | None
    messages_column: str | None
    reason: str


@dataclass
class MediaRow:
    """One row as a processor takes it: the conversation and the media it refers to, in order.

    Media parts in `messages` are `{"type": kind, kind: item}`, in the order of the media in
    `images` (RGB images), `videos` (lists of frames) and `audios` (float32 waveforms).
    `where` names the row (and caption) in errors.
    """

    messages: list[dict[str, Any]]
    where: str = ""
    images: list[Any] = field(default_factory=list)
    videos: list[list[Any]] = field(default_factory=list)
    audios: list[np.ndarray] = field(default_factory=list)


def has_media(table: TextTable, columns: Columns | None = None) -> bool:
    """Whether any column of `table` (or a part of its messages) holds media."""
    return bool(_media_found(table, columns))


def detect_modality(
    table: TextTable, forced: str | None = None, columns: Columns | None = None
) -> ModalityChoice:
    """Which modality `table` holds: the one `forced`, else the only one its columns show
    (a column `columns` names counts as that modality's).

    Raises `DataError` when no column holds media, when several modalities do and none is
    forced, or when the forced modality has no column.
    """
    named = columns or Columns()
    named.check(table.columns, table.description)
    messages_column = next((c for c in MESSAGES_COLUMNS if c in table.columns), None)
    found = _media_found(table, named)
    columns = ", ".join(repr(c) for c in table.columns) or "none"
    if forced is not None:
        if forced not in MEDIA_MODALITIES:
            raise DataError(
                f"modality {forced!r} is not one of {', '.join(MEDIA_MODALITIES)}",
                hint="Force image, video or audio; text calibration takes load_calibration.",
                param="modality",
            )
        if forced not in found:
            raise DataError(
                f"{table.description} has no {forced} column (columns found: {columns})",
                hint=f"Put the {forced} in one of "
                + ", ".join(repr(c) for c in MEDIA_COLUMNS[forced])
                + f", or as {{'type': '{forced}'}} parts of a messages column.",
                source=table.description,
            )
        modality, how = forced, f"forced; {found[forced]}"
    elif not found:
        raise DataError(
            f"{table.description} holds no image, video or audio column (columns found: {columns})",
            hint="Name media columns image/images, video/videos or audio/audios; text-only "
            "data is read by load_calibration.",
            source=table.description,
        )
    elif len(found) > 1:
        raise DataError(
            f"{table.description} holds several modalities ({', '.join(found.values())})",
            hint="Force the one to calibrate with: --modality "
            + " or --modality ".join(found)
            + ".",
            source=table.description,
            param="modality",
        )
    else:
        modality, how = next(iter(found.items()))
    column = named.media(modality) or next(
        (c for c in MEDIA_COLUMNS[modality] if c in table.columns), None
    )
    return ModalityChoice(modality, column, messages_column, f"{modality} ({how})")


def _media_found(table: TextTable, columns: Columns | None = None) -> dict[str, str]:
    """Each modality `table` holds, with the column (or messages parts) that holds it."""
    columns = columns or Columns()
    found: dict[str, str] = {}
    for modality, names in MEDIA_COLUMNS.items():
        column = columns.media(modality) or next((c for c in names if c in table.columns), None)
        if column is not None:
            found[modality] = f"column {column!r}"
    messages_column = next((c for c in MESSAGES_COLUMNS if c in table.columns), None)
    if messages_column is not None:
        for modality in _part_types(table.read_column(messages_column)):
            found.setdefault(modality, f"{{'type': '{modality}'}} parts of {messages_column!r}")
    return found


def _part_types(conversations: Sequence[object]) -> list[str]:
    """Media part types in the first rows' messages, in a stable order."""
    seen: dict[str, None] = {}
    for conversation in list(conversations)[:16]:
        for message in conversation if isinstance(conversation, list) else []:
            content = message.get("content") if isinstance(message, Mapping) else None
            for part in content if isinstance(content, list) else []:
                if isinstance(part, Mapping) and part.get("type") in MEDIA_MODALITIES:
                    seen[str(part["type"])] = None
    return list(seen)


class RowReader:
    """Builds `MediaRow`s from a table, reading each column once.

    `target_rate` is the feature extractor's sampling rate (audio only). `columns` names the
    answer column and says how a list of captions is read; `notes` collects what a user
    should be told about it.
    """

    def __init__(
        self,
        table: TextTable,
        choice: ModalityChoice,
        *,
        base: Path,
        target_rate: int | None,
        columns: Columns | None = None,
    ) -> None:
        self.table, self.choice, self.base, self.target_rate = table, choice, base, target_rate
        self.text_lists = (columns or Columns()).text_lists
        self.notes: list[str] = []
        self._columns: dict[str, Sequence[object]] = {}
        self.prompt_column = next((c for c in PROMPT_COLUMNS if c in table.columns), None)
        self.answer_column = (columns or Columns()).text or next(
            (c for c in ANSWER_COLUMNS if c in table.columns), None
        )
        self.rate_column = next((c for c in SAMPLING_RATE_COLUMNS if c in table.columns), None)
        if choice.messages_column is None and self.answer_column is None and not self.prompt_column:
            raise DataError(
                f"{table.description} has {choice.modality} but no text column (columns found: "
                + ", ".join(repr(c) for c in table.columns)
                + ")",
                hint="Add a text/caption column, a prompt column, or chat messages.",
                source=table.description,
            )

    def read(self, row: int) -> list[MediaRow]:
        """Row `row` with its media read: one sample, or one per caption of a caption list read
        `each`. Raises `DataError` naming the row on any problem."""
        where = f"{self.table.description}, row {row}"
        kind = self.choice.modality
        payloads = self._column_media(row)
        if self.choice.messages_column is not None and self._cell(self.choice.messages_column, row):
            messages, inline = _messages_with_markers(
                self._cell(self.choice.messages_column, row), kind, where, self.table.description
            )
            payloads = _merge_payloads(
                messages, inline, payloads, kind, where, self.table.description
            )
            conversations = [messages]
        else:
            conversations = self._caption_messages(row, len(payloads), where)
        media_row = MediaRow(messages=[], where=where)
        for index, payload in enumerate(payloads):
            cell = f"{where}, {kind} {index}"
            source = self.table.description
            if kind == "image":
                media_row.images.append(
                    read_image(payload, base=self.base, where=cell, source=source)
                )
            elif kind == "video":
                media_row.videos.append(
                    read_frames(payload, base=self.base, where=cell, source=source)
                )
            else:
                assert self.target_rate is not None
                rate = self._cell(self.rate_column, row) if self.rate_column else None
                media_row.audios.append(
                    read_audio(payload, sampling_rate=rate, target_rate=self.target_rate,
                               base=self.base, where=cell, source=source)
                )  # fmt: skip
        items = media_row.images or media_row.videos or media_row.audios
        samples = []
        for index, messages in enumerate(conversations):
            caption = f", caption {index}" if len(conversations) > 1 else ""
            samples.append(
                MediaRow(
                    _with_media(messages, kind, items), where=where + caption,
                    images=media_row.images, videos=media_row.videos, audios=media_row.audios,
                )
            )  # fmt: skip
        return samples

    def _cell(self, column: str, row: int) -> Any:
        if column not in self._columns:
            self._columns[column] = self.table.read_column(column)
        return self._columns[column][row]

    def _column_media(self, row: int) -> list[object]:
        if self.choice.column is None:
            return []
        value = self._cell(self.choice.column, row)
        if value is None:
            return []
        if (
            self.choice.modality == "video"
        ):  # a list of frames is one video; a list of lists, several
            if isinstance(value, list) and value and isinstance(value[0], list):
                return list(value)
            return [value]
        if self.choice.modality == "audio" and _is_sample_list(value):
            return [value]
        return list(value) if isinstance(value, (list, tuple)) else [value]

    def _caption_messages(self, row: int, count: int, where: str) -> list[list[dict[str, Any]]]:
        if count == 0:
            raise DataError(
                f"{where} has no {self.choice.modality}",
                hint=f"Give every row its {self.choice.modality}, or remove the rows without.",
                source=self.table.description,
            )
        prompt = self._cell(self.prompt_column, row) if self.prompt_column else None
        answer = self._cell(self.answer_column, row) if self.answer_column else None
        if is_text_list(answer) and not self.notes:
            self.notes.append(text_list_note(str(self.answer_column), answer, self.text_lists))
        answers: list[str | None] = list(texts_of(answer, self.text_lists)) if answer else []
        conversations = []
        for text in answers or [None]:
            user: list[dict[str, Any]] = [{"type": self.choice.modality} for _ in range(count)]
            if prompt:
                user.append({"type": "text", "text": str(prompt)})
            messages = [{"role": "user", "content": user}]
            if text:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
            conversations.append(messages)
        return conversations


def _with_media(
    messages: list[dict[str, Any]], kind: str, items: Sequence[Any]
) -> list[dict[str, Any]]:
    """`messages` with the `i`-th `{"type": kind}` part carrying `items[i]` under `kind`."""
    media = iter(items)
    laid_out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {**part, kind: next(media)} if part.get("type") == kind else dict(part)
                for part in content
            ]
        laid_out.append({**message, "content": content})
    return laid_out


def _is_sample_list(value: object) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], (int, float))


def _messages_with_markers(
    conversation: object, kind: str, where: str, source: str
) -> tuple[list[dict[str, Any]], list[object | None]]:
    """The conversation with media parts reduced to `{"type": kind}` (their media attached by
    `_with_media` once read), and each part's inline payload (None where it carries none)."""
    if not isinstance(conversation, list) or not all(
        isinstance(m, Mapping) and {"role", "content"} <= m.keys() for m in conversation
    ):
        raise DataError(
            f"{where}: messages must be a list of {{'role': ..., 'content': ...}} objects",
            hint="Write chat rows as the Hub's chat datasets do.",
            source=source,
        )
    messages: list[dict[str, Any]] = []
    inline: list[object | None] = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == kind:
                    inline.append(
                        part.get(kind) if part.get(kind) is not None else part.get("path")
                    )
                    parts.append({"type": kind})
                elif isinstance(part, Mapping) and part.get("type") == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
            content = parts
        messages.append({"role": str(message["role"]), "content": content})
    return messages, inline


def _merge_payloads(
    messages: list[dict[str, Any]],
    inline: list[object | None],
    column: list[object],
    kind: str,
    where: str,
    source: str,
) -> list[object]:
    """Each media part's payload: its own, else the column's next item, in order. A column's
    media without any part go first in the first user turn."""
    if not inline:
        if column:
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None or not isinstance(first_user["content"], (list, str)):
                raise DataError(
                    f"{where} has {kind} but no user turn to put it in",
                    hint="Add a user message, or a {'type': '" + kind + "'} part for each item.",
                    source=source,
                )
            text = first_user["content"]
            parts = [{"type": "text", "text": text}] if isinstance(text, str) else text
            first_user["content"] = [{"type": kind} for _ in column] + parts
            return list(column)
        raise DataError(
            f"{where} has no {kind}",
            hint=f"Give every row its {kind}, or remove the rows without.",
            source=source,
        )
    from_column = iter(column)
    payloads: list[object] = []
    for own in inline:
        if own is not None:
            payloads.append(own)
            continue
        payload = next(from_column, None)
        if payload is None:
            raise DataError(
                f"{where} has {len(inline)} {kind} parts in its messages but only "
                f"{len(column)} {kind} item(s) to fill them",
                hint=f"Give one {kind} per {{'type': '{kind}'}} part, in order.",
                source=source,
            )
        payloads.append(payload)
    if next(from_column, None) is not None:
        raise DataError(
            f"{where} has more {kind} items than {{'type': '{kind}'}} parts in its messages",
            hint=f"Give one {kind} per part, in order.",
            source=source,
        )
    return payloads
