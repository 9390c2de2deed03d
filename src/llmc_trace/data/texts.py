"""Pick the text column of a table and turn each of its values into one string.

A column holds either plain strings or chat conversations (lists of `{"role", "content"}`
messages, as in `messages` columns of instruction datasets). A conversation is rendered with the
tokenizer's chat template when it has one, so that calibration sees the same special tokens and
layout as inference; without a template its turns are joined as `"role: content"` lines, which
is readable but not what any chat model was trained on.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmc_trace.errors import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Searched in this order when no column is named; the first present one is used.
TEXT_COLUMN_NAMES: tuple[str, ...] = ("text", "caption", "content", "prompt", "messages")


def choose_text_column(columns: Sequence[str], column: str | None, *, description: str) -> str:
    """Return `column` if `columns` has it, else the first of `TEXT_COLUMN_NAMES` present.

    `description` names the table in the error raised when there is no such column.
    """
    found = ", ".join(repr(name) for name in columns) or "none"
    if column is not None:
        if column not in columns:
            raise DataError(
                f"{description} has no column {column!r} (columns found: {found})",
                hint="Pass one of the columns found as the text column.",
                source=description,
            )
        return column
    for name in TEXT_COLUMN_NAMES:
        if name in columns:
            return name
    raise DataError(
        f"{description} has no text column (columns found: {found})",
        hint="Name the text column with --text-column; without it, the columns "
        + ", ".join(repr(name) for name in TEXT_COLUMN_NAMES)
        + " are tried in that order.",
        source=description,
    )


def render_text(
    value: object,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    where: str,
) -> str:
    """Return the text of one cell: a string as is, a conversation rendered.

    `where` names the cell (`"data.jsonl, row 3 of 'text'"`) for the error raised on any other
    value (a null cell is the caller's to skip). An empty result means the row has no text;
    callers skip it.
    """
    if isinstance(value, str):
        return value
    if _is_conversation(value):
        return render_conversation(value, tokenizer, where=where)
    raise DataError(
        f"{where} holds the {type(value).__name__} {reprlib.repr(value)}, not text or chat "
        "messages",
        hint="Name a column of strings, or of lists of {'role': ..., 'content': ...} messages.",
        param="text_column",
    )


def render_conversation(
    messages: Sequence[Mapping[str, object]],
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    where: str,
) -> str:
    """Render chat `messages` with the tokenizer's chat template, else as "role: content" lines."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False)
    return "\n".join(
        f"{message['role']}: {_content_text(message['content'], where)}" for message in messages
    )


def _is_conversation(value: object) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(item, Mapping) and {"role", "content"} <= item.keys() for item in value)
    )


def _content_text(content: object, where: str) -> str:
    """Text of a message's content: a string, or the text parts of a multimodal part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(isinstance(part, Mapping) for part in content):
        return "".join(str(part["text"]) for part in content if part.get("type") == "text")
    raise DataError(
        f"{where} has a message whose content is the {type(content).__name__} "
        f"{reprlib.repr(content)}",
        hint="Message content must be a string or a list of {'type': 'text', 'text': ...} parts.",
        param="text_column",
    )
