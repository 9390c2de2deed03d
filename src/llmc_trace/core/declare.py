"""One declaration per option of a compression run: a field of its section's dataclass.

Every option of ``compress`` is a field of one of the dataclasses that make up a request (a
:class:`~llmc_trace.oneshot.stage.Stage`, or a section of
:mod:`~llmc_trace.oneshot.settings`), declared with :func:`option`: its default, its help, the
kind of value it takes and, where it differs from the field's name, its command-line flag. The
command line's options (:mod:`llmc_trace.cli.compress_cmd`), the recipe's keys, type checks and
written form (:mod:`~llmc_trace.oneshot.recipe`) and the request's keywords
(:class:`~llmc_trace.oneshot.request.CompressRequest`) are all derived from these fields, so an
option is added in one place, plus the code that uses it, and cannot be spelled differently in
two of them.

A *kind* says how a value is written and checked: :meth:`Kind.read` turns what a recipe or a
command line holds into the field's value (raising :class:`ValueError` with a sentence for
what cannot be one), :meth:`Kind.write` turns it back into the plain JSON value a recipe
stores. ``read(write(v)) == v`` for every value a run can hold, which is what makes a
checkpoint's ``recipe.yaml`` run again as it ran.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llmc_trace.errors import BadInputError

#: where a field keeps its :class:`Option`
_KEY = "llmc_trace.option"


class Kind(ABC):
    """How a value is read from a recipe or the command line, and written back."""

    #: what a value must be, for messages ("an integer of at least 1")
    description: str = "a value"
    #: the command line passes the text itself (``read`` parses it) unless the kind is a flag
    #: or a list, which click collects
    is_flag: bool = False
    is_list: bool = False
    #: the values a choice accepts, for the command line's own checking and help
    choices: tuple[str, ...] | None = None

    @abstractmethod
    def read(self, value: object) -> Any:
        """The field's value for ``value`` as written; ``ValueError`` saying what it must be."""

    def write(self, value: Any) -> object:
        return value


@dataclass(frozen=True)
class Int(Kind):
    """An integer of at least ``minimum``; with ``optional``, also ``None`` (unset)."""

    minimum: int | None = None
    optional: bool = False

    @property
    def description(self) -> str:  # type: ignore[override]
        text = "an integer" if self.minimum is None else f"an integer of at least {self.minimum}"
        return f"{text} or null" if self.optional else text

    def read(self, value: object) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"must be {self.description}, not {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be {self.description}, not {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be {self.description}, not {value}")
        return value


@dataclass(frozen=True)
class Float(Kind):
    """A number (an integer is taken as the float it equals)."""

    description: str = "a number"

    def read(self, value: object) -> float:
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"must be a number, not {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, not {value!r}")
        return float(value)


@dataclass(frozen=True)
class Flag(Kind):
    """True or false; on the command line ``--name/--no-name``."""

    description: str = "true or false"
    is_flag: bool = True

    def read(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, not {value!r}")
        return value


@dataclass(frozen=True)
class Text(Kind):
    """A string; with ``choices``, one of them."""

    choices: tuple[str, ...] | None = None

    @property
    def description(self) -> str:  # type: ignore[override]
        return f"one of {', '.join(self.choices)}" if self.choices else "a string"

    def read(self, value: object) -> str:
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise ValueError(f"must be {self.description}, not {value!r}")
        return value


@dataclass(frozen=True)
class Names(Kind):
    """A list of strings (on the command line repeated or comma-separated); with
    ``optional``, ``None`` means "the default", which an empty list would not."""

    optional: bool = False
    is_list: bool = True

    @property
    def description(self) -> str:  # type: ignore[override]
        return "a list of strings or null" if self.optional else "a list of strings"

    def read(self, value: object) -> tuple[str, ...] | None:
        if value is None and self.optional:
            return None
        if isinstance(value, str):  # one name, never its characters
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"must be {self.description}, not {value!r}")
        return tuple(value)

    def write(self, value: Any) -> object:
        return None if value is None else list(value)


@dataclass(frozen=True)
class Parsed(Kind):
    """A value with its own spelling (a byte size, a dtype, a sparsity, a scheme): ``parse``
    reads it (raising ``ValueError`` or a bad-input error), ``unparse`` writes it back."""

    parse: Callable[[object], Any] = lambda value: value
    unparse: Callable[[Any], object] = lambda value: value
    description: str = "a value"
    choices: tuple[str, ...] | None = None

    def read(self, value: object) -> Any:
        return self.parse(value)

    def write(self, value: Any) -> object:
        return self.unparse(value)


@dataclass(frozen=True)
class Option:
    """What a field needs beyond its name, type and default to be an option of the run."""

    help: str
    kind: Kind
    #: the command line's flag; None: the option exists only in recipes and the request
    flag: str | None
    short: str | None = None
    #: earlier names of the option, read with a warning that names the new one
    renamed_from: tuple[str, ...] = ()
    #: for a stage option: a command-line value applies to every stage of a recipe that
    #: quantizes (instead of being refused for a recipe of several stages)
    every_stage: bool = False


def option(
    default: object,
    help: str,
    kind: Kind,
    *,
    flag: str | None | bool = True,
    short: str | None = None,
    renamed_from: Sequence[str] = (),
    every_stage: bool = False,
) -> Any:
    """A dataclass field declaring an option (see the module docstring). ``flag=True`` spells
    the command-line flag from the field's name (``seq_len`` -> ``--seq-len``), a string names
    it, ``False`` keeps the option off the command line."""
    declared = Option(
        help,
        kind,
        flag if isinstance(flag, str) else ("" if flag else None),
        short,
        tuple(renamed_from),
        every_stage,
    )
    return dataclasses.field(default=default, metadata={_KEY: declared})


@dataclass(frozen=True)
class Declared:
    """One declared option as the derived interfaces see it."""

    name: str
    default: object
    option: Option

    @property
    def flag(self) -> str | None:
        if self.option.flag is None:
            return None
        return self.option.flag or "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        return self.option.help

    @property
    def kind(self) -> Kind:
        return self.option.kind


def declared(section: type) -> Iterator[Declared]:
    """The options ``section`` (a dataclass) declares, in field order."""
    for field in dataclasses.fields(section):
        found = field.metadata.get(_KEY)
        if found is not None:
            yield Declared(field.name, field.default, found)


def normalize(section: Any) -> None:
    """Read every option of the frozen dataclass ``section`` through its kind, in place, so
    that a request built in Python is checked (and spelled) as a recipe or the command line
    is: ``"0.5"`` and ``0.5`` are the same sparsity, a ``Path`` the same dataset as its text.
    A value its kind refuses is bad input naming the option."""
    for entry in declared(type(section)):
        value = getattr(section, entry.name)
        try:
            read = entry.kind.read(value)
        except BadInputError:  # a ValueError too, that already says what and what to do
            raise
        except ValueError as err:
            raise BadInputError(f"{entry.name} {err}.", hint=entry.help, param=entry.name) from None
        object.__setattr__(section, entry.name, read)
