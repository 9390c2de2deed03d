"""The ``llmc-trace`` command group.

Exit codes: 0 success; 1 the job ran and its answer is failure (not traceable, verification
mismatch, compression failed); 2 bad input, reported before heavy work starts; 141 the reader
of stdout went away (``| head``), as for any command the pipe's close ends.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from llmc_trace.cli.context import (
    CliContext,
    exit_for_closed_stdout,
    handle_errors,
    ignore_interrupts,
    pass_cli,
)
from llmc_trace.cli.ending import end_process
from llmc_trace.cli.options import model_options
from llmc_trace.cli.quiet_libraries import quiet_libraries

if TYPE_CHECKING:
    from llmc_trace.tracing.settings import TracingSettings


_QUIET_HELP = "No progress display on stderr."
_DEBUG_HELP = "Show full tracebacks instead of one-line errors."


def _raise_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and param.name is not None:
        setattr(ctx.ensure_object(CliContext), param.name, True)


class _CommandGroup(click.Group):
    """The group every command joins.

    ``--quiet`` and ``--debug`` belong to the group (``llmc-trace --quiet attempt ...``), and
    each command takes them after its name too (``llmc-trace attempt ... --quiet``), where
    people type them; both set the same flag.

    A command whose stdout closes under a plain write (``click.echo``: JSON, markdown) ends
    as the rich consoles' do (:func:`~llmc_trace.cli.context.exit_for_closed_stdout`). An
    exception no check foresaw ends in one sentence naming it, exit code 1, and the way to
    its traceback (``--debug``), instead of forty lines of frames.
    """

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params += [
            click.Option(["--quiet", "-q"], is_flag=True, expose_value=False,
                         callback=_raise_flag, help=_QUIET_HELP),
            click.Option(["--debug"], is_flag=True, expose_value=False, callback=_raise_flag,
                         help=_DEBUG_HELP),
        ]  # fmt: skip
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            exit_for_closed_stdout()
        except (click.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise  # click's own: usage errors, aborts and exits it reports itself
        except KeyboardInterrupt:  # before a command's own handling began (its imports)
            ignore_interrupts()
            click.echo("Interrupted (SIGINT): nothing was written.", err=True)
            sys.exit(130)
        except Exception as err:
            state = ctx.find_object(CliContext)
            if state is None or state.debug:
                raise
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            error = f"unexpected {type(err).__name__}" + (f": {reason}" if reason else "")
            hint = (
                "the inputs llmc-trace checks passed, and this failed after; run again with "
                "--debug for the traceback, and report it with the command."
            )
            if state.as_json:
                state.print_json({"error": error, "hint": hint, "param": None, "exit_code": 1})
            else:
                state.err.print(f"[bold red]Error:[/] {error}", highlight=False)
                state.err.print(f"[dim]Hint:[/] {hint}")
            sys.exit(1)


@click.group(
    cls=_CommandGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option("--quiet", "-q", is_flag=True, help=_QUIET_HELP)
@click.option("--debug", is_flag=True, help=_DEBUG_HELP)
@click.version_option(package_name="llmc-trace")
@click.pass_context
def cli(click_ctx: click.Context, quiet: bool, debug: bool) -> None:
    """Make large models traceable for memory-efficient compression, and compress them."""
    quiet_libraries()
    click_ctx.obj = CliContext(quiet=quiet, debug=debug)


@cli.command()
@model_options
@click.option("--no-verify", is_flag=True, help="Trace and partition only; skip the replay check.")
@click.option(
    "--real-weights",
    is_flag=True,
    help="Verify on the folder's own weights instead of the tiny twin.",
)
@click.option(
    "--fix",
    is_flag=True,
    help="When tracing fails, search for fixes (ignore, opaque calls) and verify them.",
)
@click.option(
    "--decisions",
    is_flag=True,
    help="List every branch of model code the trace took, sample-dependent first.",
)
@click.option(
    "--mappings",
    is_flag=True,
    help="Also list the smooth -> balance pairs AWQ and SmoothQuant scale, proved on the twin.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout only.")
@pass_cli
def attempt(
    ctx: CliContext,
    model: str,
    modality: str,
    tracing: TracingSettings,
    seq_len: int,
    image_size: int | None,
    no_verify: bool,
    real_weights: bool,
    fix: bool,
    decisions: bool,
    mappings: bool,
    as_json: bool,
) -> None:
    """Trace MODEL from its config, cut it into subgraphs, and prove replay equals the model.

    Exit code 0: traced and verified; 1: not traceable or not verified; 2: bad input.
    """
    from llmc_trace.attempt.prove import attempt_trace
    from llmc_trace.cli.display import show_report

    with handle_errors(ctx), ctx.progress(f"attempt {model}") as progress:
        report = attempt_trace(
            model,
            tracing=tracing,
            modality=modality,
            seq_len=seq_len,
            image_size=image_size,
            verify=not no_verify,
            real_weights=real_weights,
            fix=fix,
            progress=progress,
        )
        pairs = None
        if mappings and report.traced:
            from llmc_trace.cli.mappings_view import pairs_of

            pairs = pairs_of(ctx.err, model, modality, tracing)
    if as_json:
        from llmc_trace.cli.mappings_view import mappings_document

        document = report.to_json()
        ctx.print_json({**document, **mappings_document(pairs)} if pairs is not None else document)
    else:
        show_report(ctx.out, report)
        if decisions:
            from llmc_trace.cli.decisions_display import show_decisions

            show_decisions(ctx.out, report.decisions)
        if pairs is not None:
            from llmc_trace.cli.mappings_view import show_mappings

            show_mappings(ctx.out, pairs)
        if report.failure is not None and ctx.debug:
            ctx.err.print(report.failure.raw_traceback)
    sys.exit(0 if (report.ok or (no_verify and report.traced)) else 1)


def _register() -> None:
    from llmc_trace.cli.compress_cmd import compress_command, evaluate
    from llmc_trace.cli.coverage_cmd import coverage
    from llmc_trace.cli.plan_cmd import plan
    from llmc_trace.cli.render_cmd import render

    cli.add_command(plan)
    cli.add_command(coverage)
    cli.add_command(render)
    cli.add_command(compress_command())
    cli.add_command(evaluate)


_register()


def main() -> None:
    """The ``llmc-trace`` console script: the command, then the process's end
    (:func:`~llmc_trace.cli.ending.end_process`, which skips the interpreter's teardown)."""
    try:
        cli(prog_name="llmc-trace")
    except SystemExit as done:
        end_process(done.code)
