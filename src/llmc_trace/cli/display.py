"""Rich views of ``attempt``'s reports: tables and panels for people (the JSON view is
``to_json``). ``compress`` prints its own summary (:mod:`llmc_trace.cli.compress_cmd`) and
imports nothing from here."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.tracing.autowrap import StatementRewrite
from llmc_trace.core.sizes import human_bytes


def _compress_targets(targets: list[str], prefix: str = "") -> str:
    targets = [target.removeprefix(prefix) for target in targets]
    if len(targets) <= 2:
        return ", ".join(targets) or "—"
    return f"{targets[0]} … {targets[-1]} ({len(targets)})"


# Width of every column but ``targets``, with padding and borders: the figures never wrap.
_FIXED_COLUMNS_WIDTH = 61


def _shared_prefix(labels: list[str]) -> str:
    """The dotted module path every target starts with (``model.language_model.``), kept
    short of each target's last two parts so the rows still say which layer they hold."""
    split = [label.split(".") for label in labels if label]
    if not split:
        return ""
    shared: list[str] = []
    for parts in zip(*(path[:-2] for path in split)):
        if len(set(parts)) != 1:
            break
        shared.append(parts[0])
    return "".join(f"{part}." for part in shared)


def subgraph_table(report: TraceReport, width: int, max_rows: int = 12) -> Table:
    """One row per subgraph. Short headers, explained in the caption, keep the table inside
    80 columns; where the targets' full paths would not fit beside the figures, the path
    they share moves to the title (``targets under model.language_model.``)."""
    rows = report.subgraphs
    shown = rows if len(rows) <= max_rows else rows[: max_rows // 2] + rows[-max_rows // 2 :]
    prefix = ""
    labels = [_compress_targets(sub.targets) for sub in shown]
    if max(map(len, labels), default=0) + _FIXED_COLUMNS_WIDTH > width:
        prefix = _shared_prefix([target for sub in shown for target in sub.targets])
    title = f"{len(rows)} subgraphs" + (f", targets under {prefix}" if prefix else "")
    table = Table(
        title=title,
        title_justify="left",
        caption="out: written to the cache per sample · params: weights on the device",
        caption_justify="left",
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("targets", overflow="fold")
    for column in ("nodes", "inputs", "consumed", "out", "params"):
        table.add_column(column, justify="right", no_wrap=True)
    for i, sub in enumerate(shown):
        if len(rows) > max_rows and i == max_rows // 2:
            table.add_row("…", f"{len(rows) - max_rows} more like these", "", "", "", "", "")
        table.add_row(
            str(sub.index),
            _compress_targets(sub.targets, prefix),
            str(sub.num_nodes),
            str(len(sub.input_names)),
            str(len(sub.consumed_names)),
            human_bytes(sub.output_bytes),
            human_bytes(sub.parameter_bytes),
        )
    return table


def failure_panel(failure: TraceFailure) -> Panel:
    parts: list[object] = [Text(f"{failure.explanation}", style="bold")]
    where = failure.location
    if where is not None:
        parts.append(Text(f"{where.file}:{where.line} in {where.function}"))
        try:
            parts.append(
                Syntax.from_path(
                    where.abs_file,
                    line_range=(where.line - 2, where.line + 2),
                    highlight_lines={where.line},
                    line_numbers=True,
                    theme="ansi_dark",
                )
            )
        except OSError:
            parts.append(Text(f"  {where.code}"))
    if failure.module_path or failure.module_class:
        parts.append(Text(f"module: {failure.module_path or '<root>'} ({failure.module_class})"))
    if failure.origin:
        parts.append(Text("origin: " + " -> ".join(failure.origin)))
    parts.append(Text(failure.message, style="dim"))
    return Panel(
        Group(*parts),
        title=f"not traceable: {failure.kind}",
        border_style="red",
        title_align="left",
    )


def fix_snippet(report: TraceReport) -> str:
    """Python, recipe and command-line text that reproduce the fixed trace (paste any)."""
    assert report.applied_fix is not None
    ignore = sorted(set(report.tracing_ignore) | set(report.applied_fix.tracing_ignore))
    quoted = ", ".join(repr(name) for name in ignore)
    extra_py, extra_yaml, extra_cli = "", "", ""
    if report.targets_per_subgraph != 1:
        extra_py += f", targets_per_subgraph={report.targets_per_subgraph}"
        extra_yaml += f"  targets_per_subgraph: {report.targets_per_subgraph}\n"
        extra_cli += f" --targets-per-subgraph {report.targets_per_subgraph}"
    if report.requested_targets:
        targets = ", ".join(repr(t) for t in report.requested_targets)
        extra_py += f", sequential_targets=[{targets}]"
        extra_yaml += f"  sequential_targets: [{targets}]\n"
        extra_cli += "".join(f" -t '{t}'" for t in report.requested_targets)
    return (
        "# Python\n"
        "from llmc_trace import TracingSettings, attempt_trace\n"
        f"attempt_trace({report.model!r}, modality={report.modality!r}, "
        f"tracing=TracingSettings(tracing_ignore=[{quoted}]{extra_py}))\n\n"
        "# recipe.yaml\n"
        "tracing:\n"
        f"  tracing_ignore: [{quoted}]\n{extra_yaml}"
        "\n# command line\n"
        f"llmc-trace attempt --model {report.model} --modality {report.modality}{extra_cli} "
        + " ".join(f"--tracing-ignore '{name}'" for name in ignore)
        + "".join(rewrite_comment(rewrite) for rewrite in report.applied_fix.rewrites)
    )


def rewrite_comment(rewrite: StatementRewrite) -> str:
    """An autowrapped statement's before/after source, as comments below the snippet."""

    def commented(text: str) -> str:
        return "".join(f"#   {line}\n" if line else "#\n" for line in text.splitlines())

    return (
        f"\n\n# {rewrite.entry} rewrites, while tracing only (no file is edited),\n"
        f"# {rewrite.file}:{rewrite.line} in {rewrite.function}\n"
        f"# before:\n{commented(rewrite.before)}# after:\n{commented(rewrite.after)}"
    ).rstrip("\n")


def show_report(console: Console, report: TraceReport) -> None:
    status = (
        "[bold green]traced and verified[/]"
        if report.ok
        else (
            "[bold red]not traceable[/]"
            if not report.traced
            else "[bold yellow]traced, not verified[/]"
        )
    )
    console.print(f"{report.model} ({report.architecture}, {report.modality}): {status}")
    if report.failure is not None:
        console.print(failure_panel(report.failure))
    if report.subgraphs:
        console.print(subgraph_table(report, width=console.width))
    if report.verification is not None:
        v = report.verification
        if v.outputs:
            verdict = "[green]matches[/]" if v.ok else "[red]differs[/]"
            compared = f"(max abs diff {v.max_abs_diff:.3g}, tolerance {v.tolerance:.0e})"
        else:  # the replay or the eager forward did not run: no output was compared
            verdict, compared = "[red]not compared[/]", ""
        console.print(f"replay vs eager on the {report.verified_on}: {verdict} {compared}".rstrip())
        for problem in v.problems:
            console.print(f"  [red]•[/] {problem}")
    if report.structure is not None and not report.structure.matches:
        console.print("[yellow]The twin's trace differs from the full model's:[/]")
        for difference in report.structure.differences:
            console.print(f"  • {difference}")
    if report.fixes:
        table = Table(title="fixes tried", title_justify="left")
        for column in ("fix", "outcome", "cost"):
            table.add_column(column)
        for fix in report.fixes:
            table.add_row(fix.description, fix.outcome, fix.cost)
        console.print(table)
    if report.applied_fix is not None:
        console.print(
            Panel(
                fix_snippet(report),
                title="working configuration",
                title_align="left",
                border_style="green",
            )
        )
    timing = ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in report.timings_s.items())
    console.print(f"[dim]{timing}[/]")
