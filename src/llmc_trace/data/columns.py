"""Which columns of a table calibrate, and how a column of text lists becomes text.

Tables are found with their columns named in many ways; the loaders guess from names
(`rows.MEDIA_COLUMNS`, `texts.TEXT_COLUMN_NAMES`), and `Columns` lets a user name them instead
(`--text-column`, `--image-column`, `--audio-column`). Caption datasets (flickr30k, COCO
captions) keep several captions per image in one list cell; `texts_of` turns such a cell into
the texts calibration sees, as `text_lists` says: the first caption, each caption as its own
sample, or all of them joined. Stringifying the list (`"['a dog', 'a cat']"`) is never done:
the model would be calibrated on Python syntax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmc_trace.core.names import TEXT_LISTS
from llmc_trace.errors import DataError


@dataclass(frozen=True)
class Columns:
    """Columns a user named (None: found by name) and how text lists are read."""

    text: str | None = None
    image: str | None = None
    audio: str | None = None
    text_lists: str = "first"

    def media(self, modality: str) -> str | None:
        """The column named for `modality`'s media, if any."""
        return {"image": self.image, "audio": self.audio}.get(modality)

    def check(self, columns: Sequence[str], description: str) -> None:
        """Raise `DataError` for a named column `columns` lacks, or an unknown `text_lists`."""
        if self.text_lists not in TEXT_LISTS:
            raise DataError(
                f"text_lists {self.text_lists!r} is not one of {', '.join(TEXT_LISTS)}",
                hint="Use first (the first text of each list), each (one sample per text) or "
                "joined (all texts of a list as one).",
                param="text_lists",
            )
        found = ", ".join(repr(c) for c in columns) or "none"
        for option, name in (("text", self.text), ("image", self.image), ("audio", self.audio)):
            if name is not None and name not in columns:
                raise DataError(
                    f"{description} has no column {name!r} (columns found: {found})",
                    hint=f"Name one of the columns found with --{option}-column.",
                    source=description,
                    param=f"{option}_column",
                )


def is_text_list(value: object) -> bool:
    """Whether `value` is a non-empty list of strings (a caption dataset's captions)."""
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(item, str) for item in value)
    )


def texts_of(value: object, text_lists: str) -> list[str]:
    """The texts a cell gives: a string as is, a list of strings as `text_lists` says (one
    text for `first` and `joined`, one per item for `each`), None as none."""
    if value is None:
        return []
    if is_text_list(value):
        items = [str(item) for item in value]  # type: ignore[union-attr]
        if text_lists == "each":
            return items
        if text_lists == "joined":
            return ["\n".join(items)]
        return items[:1]
    return [str(value)]


def text_list_note(column: str, example: Sequence[str], text_lists: str) -> str:
    """The line said when a column holds lists of texts, naming what calibration takes."""
    taken = {
        "first": "the first text of each list (--text-lists each or joined uses them all)",
        "each": "every text of each list as its own sample",
        "joined": "all texts of each list joined into one",
    }[text_lists]
    return (
        f"column {column!r} holds lists of texts ({len(example)} in the first row): using {taken}"
    )
