"""``llmc-trace coverage``: which built-in architectures trace and verify, with which fix."""

from __future__ import annotations

import sys

import click

from llmc_trace.core.names import MODALITIES
from rich.table import Table

from llmc_trace.cli.context import CliContext, handle_errors, pass_cli


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
@click.option("--markdown", is_flag=True, help="Print a Markdown table (the README's).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout only.")
@pass_cli
def coverage(
    ctx: CliContext,
    models: tuple[str, ...],
    modalities: tuple[str, ...],
    no_fix: bool,
    markdown: bool,
    as_json: bool,
) -> None:
    """Attempt every built-in model and modality (with --fix for failures) and tabulate.

    Exit code 0 when every row verified, 1 otherwise.
    """
    from llmc_trace.attempt.coverage import coverage_rows

    with handle_errors(ctx), ctx.progress("coverage") as progress:
        rows = coverage_rows(
            list(models) or None, list(modalities) or None, fix=not no_fix, progress=progress
        )
    if as_json:
        ctx.print_json({"rows": [vars(r) for r in rows]})
    elif markdown:
        click.echo(
            "| model | architecture | modality | traced | verified | subgraphs | fix used "
            "| trace s | seconds |"
        )
        click.echo("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            fix = f"`{r.fix}`" if r.fix else ""
            verdict = "yes" if r.verified else f"no: {r.problem}" if r.problem else "no"
            click.echo(
                f"| {r.model} | {r.model_type} | {r.modality} | {'yes' if r.traced else 'no'} "
                f"| {verdict} | {r.subgraphs} | {fix} | {r.trace_s:.2f} | {r.seconds:.1f} |"
            )
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
            )
        ctx.out.print(table)
    sys.exit(0 if all(r.verified for r in rows) else 1)
