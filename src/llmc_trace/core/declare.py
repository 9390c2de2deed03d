"""One declaration per option of a compression run: a field of its section's dataclass.

Every option of ``compress`` is a field of one of the dataclasses that make up a request (a
:class:`~llmc_trace.spec.stage.Stage`, or a section of
:mod:`~llmc_trace.spec.settings`), declared with :func:`option`: its default, its help, the
kind of value it takes and, where it differs from the field's name, its command-line flag. The
command line's options (:mod:`llmc_trace.cli.compress_cmd`), the recipe's keys, type checks and
written form (:mod:`~llmc_trace.spec.recipe`), the request's keywords
(:class:`~llmc_trace.oneshot.request.CompressRequest`) and the report's record of a stage are
all derived from these fields, so an option is added in one place, plus the code that uses it,
and cannot be spelled differently in two of them.

A section may hold another whole (:func:`section`): a stage holds its solver's settings
(:class:`~llmc_trace.core.solver.SolverSettings`), handed whole to the algorithms that read
them. The held section's options are the holder's, flat:
one flag, one recipe key and one keyword each, as if declared in the holder
(:func:`declared`, :func:`build`, :func:`replace`).

This module lies below every package that declares options (it needs only the errors), and
imports no torch: the command line reads the declarations to answer ``--help``.

A *kind* says how a value is written and checked: :meth:`Kind.read` turns what a recipe or a
command line holds into the field's value (raising :class:`ValueError` with a sentence for
what cannot be one), :meth:`Kind.write` turns it back into the plain JSON value a recipe
stores. ``read(write(v)) == v`` for every value a run can hold, which is what makes a
checkpoint's ``recipe.yaml`` run again as it ran.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmc_trace.errors import BadInputError

#: where a field keeps its :class:`Option`
_KEY = "llmc_trace.option"
#: where a field holding a whole section keeps that section's dataclass
_SECTION = "llmc_trace.section"


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
    """A number (an integer is taken as the float it equals); with ``above``/``below``, one
    strictly between them, with ``minimum``/``maximum`` one between them or equal."""

    above: float | None = None
    below: float | None = None
    minimum: float | None = None
    maximum: float | None = None

    @property
    def description(self) -> str:  # type: ignore[override]
        bounds = [
            f"{word} {bound:g}"
            for word, bound in (
                ("above", self.above),
                ("below", self.below),
                ("at least", self.minimum),
                ("at most", self.maximum),
            )
            if bound is not None
        ]
        return f"a number {' and '.join(bounds)}" if bounds else "a number"

    def read(self, value: object) -> float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"must be {self.description}, not {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be {self.description}, not {value!r}")
        number = float(value)
        if (
            (self.above is not None and not number > self.above)
            or (self.below is not None and not number < self.below)
            or (self.minimum is not None and not number >= self.minimum)
            or (self.maximum is not None and not number <= self.maximum)
        ):
            raise ValueError(f"must be {self.description}, not {value}")
        return number


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


def section(held: type) -> Any:
    """A dataclass field holding a whole section of options, ``held`` (a frozen dataclass of
    :func:`option` fields, default-constructible): its options count as the holder's (see the
    module docstring)."""
    return dataclasses.field(default_factory=held, metadata={_SECTION: held})


@dataclass(frozen=True)
class Declared:
    """One declared option as the derived interfaces see it; ``within`` names the field of
    the held section that declares it (``None``: the section's own field)."""

    name: str
    default: object
    option: Option
    within: str | None = None

    def value(self, section: Any) -> Any:
        """The option's value in ``section`` (an instance of the dataclass that lists it)."""
        holder = section if self.within is None else getattr(section, self.within)
        return getattr(holder, self.name)

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
    """The options ``section`` (a dataclass) declares, in field order, a held section's in
    the place of the field holding it."""
    for field in dataclasses.fields(section):
        found = field.metadata.get(_KEY)
        if found is not None:
            yield Declared(field.name, field.default, found)
        held = field.metadata.get(_SECTION)
        if held is not None:
            for entry in declared(held):
                yield dataclasses.replace(entry, within=field.name)


def build(section: type, values: Mapping[str, Any]) -> Any:
    """``section`` from its options by name, flat (a held section's among them)."""
    return section(**_nested(section, values, None))


def replace(instance: Any, values: Mapping[str, Any]) -> Any:
    """``instance`` with the options ``values`` names (flat, as :func:`build` takes them)
    changed; a held section keeps the options not named."""
    return dataclasses.replace(instance, **_nested(type(instance), values, instance))


def written(instance: Any) -> dict[str, object]:
    """Every option of ``instance`` as a recipe writes it, by name, in declaration order."""
    return {
        entry.name: entry.kind.write(entry.value(instance)) for entry in declared(type(instance))
    }


def _nested(section: type, values: Mapping[str, Any], current: Any) -> dict[str, Any]:
    """``values`` by name -> the keywords of ``section``'s constructor: a held section's
    options gathered into that section (built afresh from ``current``'s, if given)."""
    keywords: dict[str, Any] = {}
    held_values: dict[str, dict[str, Any]] = {}
    owner = {e.name: e.within for e in declared(section)}
    for name, value in values.items():
        within = owner.get(name)
        if within is None:
            keywords[name] = value  # the constructor refuses an unknown name
        else:
            held_values.setdefault(within, {})[name] = value
    for within, changes in held_values.items():
        keywords[within] = (
            dataclasses.replace(getattr(current, within), **changes)
            if current is not None
            else build(_held(section, within), changes)
        )
    return keywords


def _held(section: type, name: str) -> type:
    return next(f.metadata[_SECTION] for f in dataclasses.fields(section) if f.name == name)


def normalize(section: Any) -> None:
    """Read every option of the frozen dataclass ``section`` through its kind, in place, so
    that a request built in Python is checked (and spelled) as a recipe or the command line
    is: ``"0.5"`` and ``0.5`` are the same sparsity, a ``Path`` the same dataset as its text.
    A value its kind refuses is bad input naming the option. A held section normalizes its
    own (it is a frozen dataclass of options too)."""
    for entry in declared(type(section)):
        if entry.within is not None:
            continue
        value = getattr(section, entry.name)
        try:
            read = entry.kind.read(value)
        except BadInputError:  # a ValueError too, that already says what and what to do
            raise
        except ValueError as err:
            raise BadInputError(f"{entry.name} {err}.", hint=entry.help, param=entry.name) from None
        object.__setattr__(section, entry.name, read)
