"""``llmc-trace coverage``: which built-in architectures (or, with ``--all``, which generative
model types of the installed transformers) trace and verify, with which fix."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from llmc_trace.core.names import MODALITIES
from rich.table import Table

from llmc_trace.cli.context import CliContext, handle_errors, pass_cli
from llmc_trace.cli.options import NamedPath, tracing_options
from llmc_trace.tracing.settings import TracingSettings


@click.command()
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    help="Limit to these models (default: every built-in).",
)
@click.option(
    "--modality",
    "modalities",
    multiple=True,
    type=click.Choice(MODALITIES),
    help="Limit to these modalities (default: all each model supports).",
)
@click.option("--no-fix", is_flag=True, help="Do not retry failures with the fix search.")
@click.option(
    "--all",
    "every_type",
    is_flag=True,
    help="Sweep every generative model type of the installed transformers, each built from "
    "its default config, or a built-in config of the type where transformers cannot run the "
    "default (--model then names model types).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Processes the --all sweep runs in.",
)
@click.option(
    "--table",
    "table_from",
    type=NamedPath(exists=True, dir_okay=False, path_type=Path),
    help="Print the README's Markdown table from a saved `coverage --all --json` and exit.",
)
@click.option(
    "--pairs",
    is_flag=True,
    help="Count each text model's smooth -> balance pairs (AWQ, SmoothQuant), found and proved "
    "(about triples the run).",
)
@click.option("--markdown", is_flag=True, help="Print a Markdown table (the README's).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout only.")
@tracing_options
@pass_cli
def coverage(
    ctx: CliContext,
    models: tuple[str, ...],
    modalities: tuple[str, ...],
    no_fix: bool,
    every_type: bool,
    workers: int,
    table_from: Path | None,
    pairs: bool,
    markdown: bool,
    as_json: bool,
    tracing: TracingSettings,
) -> None:
    """Attempt every built-in model and modality (with --fix for failures) and tabulate.

    The tracing flags (--sequential-targets, --targets-per-subgraph, --tracing-ignore) apply
    to every model covered, as `attempt` applies them to one; a model they name nothing of
    gets a row that did not trace, saying so (narrow the run with --model). With --all, every
    generative model type of the installed transformers instead, each from its default config
    shrunk to a tiny twin, or from a built-in config of the type where transformers cannot run
    the default (types it cannot run at all are listed apart); --all sweeps each type as it
    traces by default, so it takes no tracing flags, nor does --table. Exit code 0 when every
    row verified (with --all: every counted type), 1 otherwise.
    """
    if tracing != TracingSettings() and (every_type or table_from is not None):
        raise click.UsageError(
            f"{'--all' if every_type else '--table'} takes no tracing flags: it covers each "
            "model type as it traces by default. Drop the tracing flags, or cover built-ins "
            "with --model instead."
        )
    if markdown and as_json:
        raise click.UsageError("--markdown and --json each choose what stdout holds: give one.")
    if table_from is not None:
        from llmc_trace.attempt.sweep_report import saved_sweep_table

        with handle_errors(ctx):
            click.echo(saved_sweep_table(table_from))
        return
    if every_type:
        _sweep_all(ctx, list(models) or None, not no_fix, workers, markdown, as_json)
        return
    from llmc_trace.attempt.coverage import coverage_markdown, coverage_rows, pairs_text

    with handle_errors(ctx), ctx.progress("coverage") as progress:
        rows = coverage_rows(
            list(models) or None,
            list(modalities) or None,
            fix=not no_fix,
            progress=progress,
            pairs=pairs,
            tracing=tracing,
        )
    if as_json:
        ctx.print_json({"rows": [vars(r) for r in rows]})
    elif markdown:
        click.echo(coverage_markdown(rows))
    else:
        table = Table(
            title=f"coverage: {sum(r.verified for r in rows)}/{len(rows)} verified, "
            f"{sum(r.seconds for r in rows):.0f} s",
            title_justify="left",
        )
        for column in (
            "model",
            "architecture",
            "modality",
            "traced",
            "verified",
            "subgraphs",
            "fix used",
            "trace s",
            "s",
            "smoothing pairs",
        ):
            table.add_column(column)
        for r in rows:
            table.add_row(
                r.model,
                r.model_type,
                r.modality,
                "yes" if r.traced else "no",
                "[green]yes[/]" if r.verified else f"[red]no[/] {r.problem}",
                str(r.subgraphs),
                r.fix,
                f"{r.trace_s:.2f}",
                f"{r.seconds:.1f}",
                pairs_text(r),
            )
        ctx.out.print(table)
    sys.exit(0 if all(r.verified for r in rows) else 1)


def _sweep_all(
    ctx: CliContext,
    model_types: list[str] | None,
    fix: bool,
    workers: int,
    markdown: bool,
    as_json: bool,
) -> None:
    from llmc_trace.attempt.sweep import cpu_seconds, sweep
    from llmc_trace.attempt.sweep_report import sweep_document, sweep_table
    from llmc_trace.models.defaults import generative_types

    unknown = sorted(set(model_types or []) - set(generative_types()))
    if unknown:
        raise click.BadParameter(
            f"{', '.join(unknown)} "
            f"{'is not a generative model type' if len(unknown) == 1 else 'are not generative model types'} "
            "of this transformers: --all takes model types (config.json's model_type, such as "
            "llama or qwen2_vl; the architectures guide's table lists every one).",
            param_hint="--model",
        )
    start, cpu_start = time.perf_counter(), cpu_seconds()
    with handle_errors(ctx), ctx.progress("coverage --all") as progress:
        rows = sweep(model_types, fix=fix, workers=workers, progress=progress)
    elapsed_s, cpu_s = time.perf_counter() - start, cpu_seconds() - cpu_start
    document = sweep_document(rows, elapsed_s, cpu_s, workers)
    summary = document["summary"]
    if as_json:
        ctx.print_json(document)
    elif markdown:
        click.echo(sweep_table(document))
    else:
        table = Table(
            title=f"coverage --all (transformers {document['transformers']}): "
            f"{summary['verified']}/{summary['counted']} model types verified, "
            f"{len(summary['transformers_cannot_run'])} that transformers cannot run and "
            f"{len(summary.get('not_standalone', []))} with no forward of their own apart, "
            f"{document['elapsed_s']:.0f} s",
            title_justify="left",
        )
        for column in ("model type", "config", "modality", "outcome", "fix", "where", "s"):
            table.add_column(column)
        for r in rows:
            outcome = "[green]verified[/]" if r.verified else f"[red]{r.outcome}[/]"
            table.add_row(
                r.model_type,
                r.config,
                r.modality,
                outcome,
                r.fix,
                r.problem,
                f"{r.seconds:.1f}",
            )
        ctx.out.print(table)
    sys.exit(0 if not summary["failed"] else 1)
