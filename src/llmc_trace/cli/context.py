"""State shared by every command: consoles, quiet/debug flags, and error handling."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from llmc_trace.errors import BadInputError, LlmcTraceError


#: The shell's exit code for a command whose reader went away (killed by SIGPIPE).
CLOSED_PIPE_EXIT = 128 + signal.SIGPIPE


def exit_for_closed_stdout() -> NoReturn:
    """End the command whose stdout's reader went away (``llmc-trace plan ... | head``).

    rich and click both answer that with exit code 1, which here means "not traceable"; the
    shell's own code for it says what happened. ``SystemExit`` unwinds the command as any
    exception does (a ``compress`` removes its staging folder), and stdout moves to
    ``/dev/null`` so that the interpreter's last flush is silent.
    """
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(CLOSED_PIPE_EXIT)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        self.quiet = True
        exit_for_closed_stdout()


@dataclass
class CliContext:
    """Consoles and flags; people read stdout, progress and logs go to stderr."""

    quiet: bool = False
    debug: bool = False
    #: the running command prints JSON: its errors are JSON documents on stdout too
    as_json: bool = False
    out: Console = field(default_factory=lambda: _Console(highlight=False, soft_wrap=False))
    err: Console = field(default_factory=lambda: _Console(stderr=True, highlight=False))

    def print_json(self, document: dict[str, Any]) -> None:
        click.echo(json.dumps(document, sort_keys=True, indent=2, default=str))

    @contextlib.contextmanager
    def progress(self, description: str) -> Iterator[Callable[[str, int, int], None]]:
        """A progress callback ``(stage, done, total)`` drawn on stderr unless quiet."""
        if self.quiet:
            yield lambda stage, done, total: None
            return
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.err,
            transient=True,
            # rich's default 10 redraws a second slow a Python-bound trace by half on 2 cores
            # (measured: Switch-128 0.52 -> 0.79 s); 4 a second costs about 3 %
            refresh_per_second=4,
        )
        with bar:
            task = bar.add_task(description, total=None)

            def report(stage: str, done: int, total: int) -> None:
                bar.update(
                    task, description=f"{description} · {stage}", completed=done, total=total
                )

            yield report


pass_cli = click.make_pass_decorator(CliContext, ensure=True)


@contextlib.contextmanager
def handle_errors(ctx: CliContext) -> Iterator[None]:
    """Bad input exits 2 naming the parameter; other project errors exit 1 with their hint.
    An error every rank of a distributed run raised together is shown by rank 0 alone.

    Under ``--json`` the error is the one JSON document on stdout (``error``, ``hint``,
    ``param``, ``exit_code``), so a script reading stdout never meets a half document.
    """
    current = click.get_current_context(silent=True)
    ctx.as_json = bool(current is not None and current.params.get("as_json"))
    try:
        yield
    except LlmcTraceError as err:
        if ctx.debug:
            raise
        code = 2 if isinstance(err, BadInputError) else 1
        if err.shown_by_rank_0:  # every rank raised it together: rank 0 alone says it
            from llmc_trace.core.world import current_world

            if not current_world().is_main:
                sys.exit(code)
        option = _option_named(current, err.param) if err.param else None
        if ctx.as_json:
            ctx.print_json(
                {"error": err.message, "hint": err.hint, "param": option, "exit_code": code}
            )
            sys.exit(code)
        if isinstance(err, BadInputError):
            sentence = err.message if err.message.endswith((".", "!", "?")) else f"{err.message}."
            raise click.BadParameter(
                f"{sentence} {err.hint}".strip(),
                param_hint=option,
            ) from err
        ctx.err.print(f"[bold red]Error:[/] {err.message}")
        if err.hint:
            ctx.err.print(f"[dim]Hint:[/] {err.hint}")
        sys.exit(1)


def _option_named(current: click.Context | None, param: str) -> str:
    """The flag a person typed for the library's ``param``: the command's own spelling where
    ``param`` is one of an option's names or aliases (evaluate's ``--data`` is also
    ``--dataset``, the name the data loaders report), else ``--param``."""
    flag = f"--{param.replace('_', '-')}"
    options = [
        p for p in (current.command.params if current else []) if isinstance(p, click.Option)
    ]
    for option in options:
        if option.name == param or flag in option.opts:
            return max(option.opts, key=lambda o: o.startswith("--"))
    return flag


class Terminated(BaseException):
    """SIGTERM, raised where the process is so that every ``with`` and ``finally`` unwinds
    (the checkpoint writer removes its staging folder) instead of the process vanishing."""


def ignore_interrupts() -> None:
    """Once an interrupt is being answered, further Ctrl-C's are ignored: a second one would
    break into the cleanup or the interpreter's exit handlers and print their traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def interruptible(
    ctx: CliContext, what: str, kept: Callable[[], str | None] | None = None
) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into an orderly end: the work unwinds (nothing half written
    stays: staging folders are removed, an existing output is untouched, save a resume point,
    which ``kept`` then describes), one sentence says so, and the exit code is the shell's for
    the signal (130, 143)."""

    def terminate(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    except (KeyboardInterrupt, Terminated) as err:
        ignore_interrupts()
        name, code = ("SIGINT", 130) if isinstance(err, KeyboardInterrupt) else ("SIGTERM", 143)
        resumable = kept() if kept is not None else None
        ctx.err.print(
            f"[bold red]Interrupted[/] ({name}): {what} stopped; "
            + (resumable or "nothing was written")
            + ". Any earlier output is as it was."
        )
        sys.exit(code)
    finally:
        signal.signal(signal.SIGTERM, previous)
