"""Options shared by the commands, and the click options derived from declared ones.

A declared option (:mod:`~llmc_trace.core.declare`) becomes a flag here with its help, kind
and default: ``compress`` derives every flag this way, and the commands that trace a model
(``attempt``, ``render``, ``plan``) derive their tracing flags from
:class:`~llmc_trace.tracing.settings.TracingSettings` with :func:`tracing_options`, which hands
the command one ``tracing`` value instead of a parameter per flag.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from llmc_trace.core.declare import Declared, Float, Int, declared
from llmc_trace.core.names import AUTO, MODALITIES
from llmc_trace.tracing.settings import TracingSettings

SHOW_DEFAULT = {"show_default": True}


class NamedPath(click.Path):
    """A path option that refuses an empty string, which a path reads as the current folder
    (``--out ""`` would otherwise be refused as the existing folder ``.``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: give a path.", param, ctx)
        return super().convert(value, param, ctx)


def split_list(values: tuple[str, ...]) -> list[str] | None:
    """``--x a,b --x c`` -> ``[a, b, c]``; nothing given -> ``None`` (use defaults)."""
    items = [item.strip() for value in values for item in value.split(",") if item.strip()]
    return items or None


def declared_option(entry: Declared) -> Callable[[Any], Any]:
    """The click option of a declared option: its flag (``--x/--no-x`` for a flag), its short
    form, and how click reads it (:func:`_click_settings`)."""
    assert entry.flag is not None
    if entry.kind.is_flag:
        flags = [f"{entry.flag}/--no-{entry.flag.removeprefix('--')}"]
    else:
        flags = [entry.flag, *([entry.option.short] if entry.option.short else [])]
    return click.option(*flags, entry.name, **_click_settings(entry))


def _click_settings(entry: Declared) -> dict[str, Any]:
    """How click reads the option: its own types where they check as well (integers with a
    minimum, numbers, choices, flags, lists), the text otherwise (the kind reads it). The
    declared default is shown; only typed flags override the defaults and a recipe."""
    kind = entry.kind
    found: dict[str, Any] = {"help": entry.help, "show_default": True}
    if kind.is_flag:
        return {**found, "default": entry.default}
    if kind.is_list:
        return {**found, "multiple": True}
    shown = kind.write(entry.default)
    if shown is None and kind.choices and AUTO in kind.choices:
        shown = AUTO
    found["default"] = shown
    if kind.choices:
        found["type"] = click.Choice(kind.choices)
    elif isinstance(kind, Int):
        found["type"] = click.INT if kind.minimum is None else click.IntRange(kind.minimum)
    elif isinstance(kind, Float):
        found["type"] = click.FLOAT
    else:  # never a type click guesses from the default (an int for `--max-shard-size`)
        found["type"] = click.STRING
    return found


def _renamed(old: str, new: str):  # type: ignore[no-untyped-def]
    """A callback for a flag's earlier spelling: accepted, with a warning naming the new one
    (``--ignore`` of the tracing commands is ``--tracing-ignore``; in ``compress``, ``--ignore``
    keeps layers in full precision)."""

    def warn(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
        if value:
            click.echo(f"warning: {old} is now {new}; use {new}.", err=True)
        return value

    return warn


def tracing_options(fn):  # type: ignore[no-untyped-def]
    """The flags of :class:`~llmc_trace.tracing.settings.TracingSettings`, derived from its
    declaration, plus ``--ignore``/``-i``, the earlier spelling of ``--tracing-ignore``
    (hidden, warned about). The command receives them as one ``tracing`` keyword."""
    entries = list(declared(TracingSettings))

    @functools.wraps(fn)
    def command(*args: Any, renamed_ignore: tuple[str, ...], **kwargs: Any) -> Any:
        values = {entry.name: kwargs.pop(entry.name) for entry in entries}
        values["tracing_ignore"] += renamed_ignore
        listed = {
            name: split_list(value) if isinstance(value, tuple) else value
            for name, value in values.items()
        }
        listed["tracing_ignore"] = tuple(listed["tracing_ignore"] or ())
        return fn(*args, tracing=TracingSettings(**listed), **kwargs)

    command = click.option(
        "--ignore",
        "-i",
        "renamed_ignore",
        multiple=True,
        hidden=True,
        callback=_renamed("--ignore", "--tracing-ignore"),
    )(command)
    for entry in reversed(entries):
        command = declared_option(entry)(command)
    return command


def model_options(fn=None, *, model_required: bool = True):  # type: ignore[no-untyped-def]
    """Options every command that traces a model shares: the model, the sample it is traced
    on, and :func:`tracing_options`. ``@model_options(model_required=False)`` for a command
    that also works without a model (``render --report``), which then checks for ``--model``
    itself."""
    if fn is None:
        return lambda command: model_options(command, model_required=model_required)
    options = [
        click.option(
            "--model",
            "-m",
            required=model_required,
            help="Built-in name, hub id (config only), or local folder with config.json.",
        ),
        click.option(
            "--modality",
            default="text",
            **SHOW_DEFAULT,
            type=click.Choice(MODALITIES),
            help="Which inputs the sample holds.",
        ),
        tracing_options,
        click.option(
            "--seq-len",
            default=32,
            **SHOW_DEFAULT,
            type=click.IntRange(2),
            help="Text length of the tracing sample.",
        ),
        click.option(
            "--image-size",
            type=click.IntRange(1),
            default=None,
            help="Image side in pixels (default: the smallest the model accepts).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn
