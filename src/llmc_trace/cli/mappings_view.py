"""``--mappings`` of ``plan`` and ``attempt``: the smooth -> balance pairs AWQ and SmoothQuant
would scale, as a table (the same pair of every layer on one row), and the pairs left out."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from llmc_trace.traced.mappings import MappingSet
    from llmc_trace.tracing.settings import TracingSettings


def pairs_of(
    err: Console, model: str, modality: str, tracing: TracingSettings
) -> MappingSet | None:
    """The model's pairs, or ``None`` with a line on ``err`` saying why there are none: the
    trace into its layers, which finds them, stopped."""
    from llmc_trace.errors import TraceStopped
    from llmc_trace.traced.mappings import source_mappings

    try:
        return source_mappings(model, modality=modality, tracing=tracing)
    except TraceStopped as stopped:
        err.print(f"no smooth -> balance pairs: the trace into the layers stopped ({stopped})")
        return None


def mappings_document(found: MappingSet) -> dict[str, object]:
    """The pairs as ``--json`` prints them: every pair, unfolded."""
    return {
        "mappings": [
            {"smooth": m.smooth, "balance": list(m.balance), "kept": list(m.kept), "rows": m.rows}
            for m in found.mappings
        ],
        "skipped": [
            {"smooth": s.smooth, "balance": list(s.balance), "reason": s.reason}
            for s in found.skipped
        ],
        "mappings_fix": list(found.fix),
        "unreached": list(found.unreached),
    }


def show_mappings(out: Console, found: MappingSet) -> None:
    """One row per kind of pair, with how many layers have it; then the pairs left out."""
    from llmc_trace.traced.mappings import numberless

    rows: dict[str, list[str]] = {}
    for mapping in found.mappings:
        # a mixture's experts once: model.layers.#.mlp.experts.#.up_proj
        names = dataclasses.replace(
            mapping,
            balance=tuple(dict.fromkeys(map(numberless, mapping.balance))),
            kept=tuple(dict.fromkeys(map(numberless, mapping.kept))),
        )
        rows.setdefault(numberless(names.describe()), []).append(mapping.smooth)
    table = Table(
        title="smooth -> balance pairs (AWQ, SmoothQuant), each proved on the twin",
        title_justify="left",
    )
    for column in ("smooth", "balance", "pairs"):
        table.add_column(column, justify="right" if column == "pairs" else "left")
    for key, smooths in rows.items():
        smooth, _, balance = key.partition(" -> ")
        table.add_row(smooth, balance, str(len(smooths)))
    out.print(table)
    if found.fix:
        out.print(
            f"read with --tracing-ignore {' '.join(found.fix)}: the fixes the trace into the "
            "layers needed (found as `attempt --fix` finds them; for reading the pairs only)",
            highlight=False,
        )
    for line in found.skipped_lines():
        out.print(line)
