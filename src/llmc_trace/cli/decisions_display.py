"""``attempt --decisions``: the branches a trace baked in, those that depend on the sample first."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from llmc_trace.tracing.decisions import Decision

_STYLES = {
    "value": "bold red",
    "shape": "yellow",
    "config": "cyan",
    "constant": "dim",
    "unknown": "magenta",
}


def decisions_table(decisions: list[Decision]) -> Table:
    """One row per decision, in the report's order (value, shape, config, constant, unknown)."""
    table = Table(title="decisions the trace baked in", title_justify="left", show_lines=False)
    for column in ("status", "where", "condition", "taken", "decided by", "what flips it"):
        table.add_column(column, overflow="fold")
    for decision in decisions:
        style = _STYLES.get(decision.status, "")
        owner = f" (in {decision.owner})" if decision.owner else ""
        table.add_row(
            f"[{style}]{decision.status}[/]",
            f"{decision.file}:{decision.line}\n[dim]{decision.function}{owner}[/]",
            f"{decision.kind} {decision.source}",
            decision.outcome(),
            decision.decided_by,
            decision.flips,
        )
    return table


def show_decisions(console: Console, decisions: list[Decision]) -> None:
    """The table, and a count per status (the unguarded data-dependent ones named)."""
    if not decisions:
        console.print("[dim]No decision of model code was recorded.[/]")
        return
    console.print(decisions_table(decisions))
    counts: dict[str, int] = {}
    for decision in decisions:
        counts[decision.status] = counts.get(decision.status, 0) + 1
    console.print(", ".join(f"{count} {status}" for status, count in counts.items()))
    for decision in decisions:
        if decision.unguarded:
            console.print(
                f"[red]unguarded data-dependent decision[/] at {decision.file}:{decision.line}"
            )
