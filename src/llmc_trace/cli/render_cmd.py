"""``llmc-trace render``: draw a model's trace as an SVG picture or an interactive HTML page, or
redraw a compression report from its ``report.json``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import click

from llmc_trace.cli.context import CliContext, handle_errors, pass_cli
from llmc_trace.cli.options import NamedPath, SHOW_DEFAULT, model_options
from llmc_trace.core.files import check_parent_folders
from llmc_trace.core.names import VIEWS
from llmc_trace.errors import BadInputError

if TYPE_CHECKING:
    from llmc_trace.tracing.settings import TracingSettings

_INDEX_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_subgraphs(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[int] | None:
    """``"3,4,10-12"`` -> ``[3, 4, 10, 11, 12]``; nothing given -> ``None`` (all)."""
    if value is None:
        return None
    indices: list[int] = []
    for item in (part.strip() for part in value.split(",")):
        match = _INDEX_RANGE.match(item)
        if match is None or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise click.BadParameter(
                f"{item!r} is not a subgraph number or range. Use e.g. 3,4 or 1-3.", ctx, param
            )
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        indices.extend(i for i in range(first, last + 1) if i not in indices)
    return indices


def check_out(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    if value.suffix.lower() not in (".svg", ".html"):
        raise click.BadParameter(
            f"{value.name!r} has no .svg or .html extension. Name the file *.svg for the "
            "picture or *.html for the interactive page.",
            ctx,
            param,
        )
    try:
        check_parent_folders(value)
    except BadInputError as err:
        raise click.BadParameter(f"{err.message} {err.hint}", ctx, param) from err
    return value


@click.command()
@model_options(model_required=False)
@click.option(
    "--report",
    "report_path",
    default=None,
    type=NamedPath(dir_okay=False, path_type=Path),
    help="A compression report (report.json, written by compress) to draw instead of a "
    "model: its overview coloured by relative loss (*.svg), or its page (*.html).",
)
@click.option(
    "--out",
    "-o",
    required=True,
    callback=check_out,
    type=NamedPath(dir_okay=False, writable=True, path_type=Path),
    help="File to write: *.svg (picture) or *.html (self-contained page with pan, "
    "zoom, search and a details panel; the overview's page unfolds in place, down to "
    "operations and module children).",
)
@click.option(
    "--view",
    "-v",
    default="overview",
    type=click.Choice(VIEWS),
    **SHOW_DEFAULT,
    help="overview: subgraphs and the values between them; detail: operations of "
    "chosen subgraphs; modules: module tree by tracing role; failure: the graph up "
    "to the point where tracing stopped; source: the model code the trace ran, each "
    "branch coloured by what decided it, lines linked to their graph nodes (*.html).",
)
@click.option(
    "--subgraphs",
    "-s",
    callback=parse_subgraphs,
    help="Subgraphs the detail view draws, e.g. 3,4 or 1-3.  [default: all]",
)
@click.option(
    "--expand",
    is_flag=True,
    help="Draw every member of each run of identical layers (overview, detail) or numbered "
    "sibling modules (modules); without it a deep model's runs (more than 8 members) are "
    "drawn once, and the overview's page opens folded.",
)
@pass_cli
def render(
    ctx: CliContext,
    model: str | None,
    modality: str,
    tracing: TracingSettings,
    seq_len: int,
    image_size: int | None,
    out: Path,
    view: str,
    subgraphs: list[int] | None,
    expand: bool,
    report_path: Path | None,
) -> None:
    """Draw MODEL's trace with Graphviz into an SVG picture or an interactive HTML page;
    with --report, draw a compression report instead.

    Exit code 0: written; 1: the model is not traceable (see it with --view failure);
    2: bad input.
    """
    from llmc_trace.render import render as render_model

    if report_path is not None:
        _render_report(ctx, report_path, out)
        return
    if model is None:
        raise click.UsageError("Missing option '--model' / '-m' (or draw a --report).")

    with handle_errors(ctx), ctx.progress(f"render {model}") as progress:
        result = render_model(
            model,
            out,
            view=view,
            subgraphs=subgraphs,
            expand=expand,
            tracing=tracing,
            modality=modality,
            seq_len=seq_len,
            image_size=image_size,
            progress=progress,
        )
    nodes = f"{result.num_nodes} node{'s' if result.num_nodes != 1 else ''}"
    ctx.out.print(f"Wrote {out} ({view} view, {nodes}).")


def _render_report(ctx: CliContext, report_path: Path, out: Path) -> None:
    """Draw the compression report in ``report_path`` into ``out`` (page or overview); the
    options for drawing a model (``--model`` among them) are refused, not ignored."""
    from llmc_trace.render.api import write_atomically
    from llmc_trace.report import read_report, render_report_html, render_report_svg

    context = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("model", "view", "subgraphs", "expand", "sequential_targets", "tracing_ignore")
        if context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"options for drawing a model's trace ({', '.join(given)}) do not apply to "
            "--report, which redraws a compression report. Leave them out, or leave out --report."
        )
    with handle_errors(ctx):
        report = read_report(report_path)
        html = out.suffix.lower() == ".html"
        text = render_report_html(report) if html else render_report_svg(report)
        write_atomically(out, text)
    what = "page" if html else "overview"
    ctx.out.print(f"Wrote {out} (compression report {what}, {len(report.layers)} layers).")
