"""Options shared by the commands that trace a model."""

from __future__ import annotations

import click

from llmc_trace.core.names import MODALITIES

SHOW_DEFAULT = {"show_default": True}


def split_list(values: tuple[str, ...]) -> list[str] | None:
    """``--x a,b --x c`` -> ``[a, b, c]``; nothing given -> ``None`` (use defaults)."""
    items = [item.strip() for value in values for item in value.split(",") if item.strip()]
    return items or None


def _renamed(old: str, new: str):  # type: ignore[no-untyped-def]
    """A callback for a flag's earlier spelling: accepted, with a warning naming the new one
    (``--ignore`` of the tracing commands is ``--tracing-ignore``; in ``compress``, ``--ignore``
    keeps layers in full precision)."""

    def warn(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
        if value:
            click.echo(f"warning: {old} is now {new}; use {new}.", err=True)
        return value

    return warn


def tracing_ignore_list(given: tuple[str, ...], renamed: tuple[str, ...]) -> list[str] | None:
    """The tracing ignore list from ``--tracing-ignore`` and its earlier spelling."""
    return split_list(given + renamed)


def model_options(fn=None, *, model_required: bool = True):  # type: ignore[no-untyped-def]
    """Options every command that traces a model shares. ``@model_options(model_required=False)``
    for a command that also works without a model (``render --report``), which then checks
    for ``--model`` itself."""
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
        click.option(
            "--sequential-targets",
            "-t",
            multiple=True,
            help="Target class names or 're:' path patterns (comma-separated or "
            "repeated). Default: the language model's repeated blocks.",
        ),
        click.option(
            "--tracing-ignore",
            multiple=True,
            help="Modules (class or 're:' pattern) to keep as leaves, or functions to "
            "record as opaque calls. Default: transformers' mask builders.",
        ),
        click.option(
            "--ignore",
            "-i",
            "renamed_ignore",
            multiple=True,
            hidden=True,
            callback=_renamed("--ignore", "--tracing-ignore"),
        ),
        click.option(
            "--targets-per-subgraph",
            default=1,
            **SHOW_DEFAULT,
            type=click.IntRange(1),
            help="Consecutive targets grouped into one subgraph.",
        ),
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
