"""The sweep's document and table: what ``coverage --all --json`` prints, what the README shows.

A type counts when transformers can run some modality of it, and verifies when every counted
modality does; the types transformers cannot run at all are listed apart with its own error for
the type's default config, and apart again the classes with no forward a calibration can run on
its own (a generate-only wrapper, a draft model), with why. A type swept from a built-in published config (its default cannot
run) says which.
The README's table is generated from the document alone, so it cannot drift from the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers

from llmc_trace.attempt.sweep import SweepRow
from llmc_trace.attempt.sweep_type import DEFAULT, NOT_STANDALONE
from llmc_trace.errors import BadInputError


def sweep_document(
    rows: list[SweepRow], elapsed_s: float, cpu_s: float, workers: int
) -> dict[str, Any]:
    """The sweep as ``--json`` prints it and the README's table is generated from."""
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "elapsed_s": round(elapsed_s, 1),
        "cpu_s": round(cpu_s, 1),
        "workers": workers,
        "summary": summarize(rows),
        "rows": [vars(row) for row in rows],
    }


def summarize(rows: list[SweepRow]) -> dict[str, Any]:
    """Types counted (some modality transformers can run), verified (every counted modality
    verified), and the share; the types swept from a built-in config; apart, the types whose
    class has no forward a calibration can run on its own, and those transformers cannot run; the decisions of the settled traces by kind and status, and the
    data-dependent ones no opaque call owns (the risk list)."""
    by_type: dict[str, list[SweepRow]] = {}
    for row in rows:
        by_type.setdefault(row.model_type, []).append(row)
    counted = {t: [r for r in rs if r.counted] for t, rs in by_type.items()}
    counted = {t: rs for t, rs in counted.items() if rs}
    verified = sorted(t for t, rs in counted.items() if all(r.verified for r in rs))
    standalone = {r.model_type for r in rows if r.outcome == NOT_STANDALONE}
    return {
        "types": len(by_type),
        "counted": len(counted),
        "verified": len(verified),
        "verified_share": round(len(verified) / len(counted), 4) if counted else 0.0,
        "failed": sorted(set(counted) - set(verified)),
        "from_builtin": sorted({r.model_type for r in rows if r.counted and r.config != DEFAULT}),
        "not_standalone": sorted(standalone),
        "transformers_cannot_run": sorted(set(by_type) - set(counted) - standalone),
        "decisions": decision_counts(rows),
        "unguarded": [
            {"model_type": r.model_type, "modality": r.modality, "where": where}
            for r in rows
            for where in r.unguarded
        ],
    }


def decision_counts(rows: list[SweepRow]) -> dict[str, dict[str, int]]:
    """The decisions of every row's settled trace, counted by kind, then status."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        for key, count in row.decisions.items():
            kind, status = key.split(" ", 1)
            by_status = counts.setdefault(kind, {})
            by_status[status] = by_status.get(status, 0) + count
    return {kind: dict(sorted(by_status.items())) for kind, by_status in sorted(counts.items())}


def sweep_table(document: dict[str, Any]) -> str:
    """The README's table from a sweep document: one row per model type, then the types
    transformers itself cannot run, with its error, and the classes with no forward of their
    own to calibrate, with why."""
    rows = [SweepRow(**row) for row in document["rows"]]
    summary = document["summary"]
    lines = [
        f"`llmc-trace coverage --all` on transformers {document['transformers']} (torch "
        f"{document['torch']}): {summary['verified']} of the {summary['counted']} generative "
        f"model types transformers can run verified ({100 * summary['verified_share']:.1f} %), "
        f"in {document['elapsed_s']:.0f} s with {document['workers']} workers "
        f"({document['cpu_s']:.0f} CPU seconds in all).",
        "",
        "| model type | class | config | verified | fix | not verified: where |",
        "|---|---|---|---|---|---|",
    ]
    apart, standalone = [], []
    for model_type in sorted({row.model_type for row in rows}):
        mine = [row for row in rows if row.model_type == model_type]
        counted = [row for row in mine if row.counted]
        if mine[0].outcome == NOT_STANDALONE:
            standalone.append(
                f"| {model_type} | {mine[0].model_class} | {_cell(mine[0].problem)} |"
            )
            continue
        if not counted:  # the config's own error: where it failed to build, else on text
            first = next((row for row in mine if row.modality in ("-", "text")), mine[0])
            apart.append(f"| {model_type} | {first.model_class} | {_cell(first.problem)} |")
            continue
        configs = ", ".join(sorted({row.config for row in counted}, key=lambda c: c != DEFAULT))
        good = ", ".join(row.modality for row in counted if row.verified) or "no"
        fixes = "; ".join(dict.fromkeys(f"`{row.fix}`" for row in counted if row.fix))
        bad = "; ".join(
            f"{row.modality}: {row.outcome}: {_cell(row.problem)}"
            for row in mine
            if not row.verified
        )
        lines.append(
            f"| {model_type} | {mine[0].model_class} | {configs} | {good} | {fixes} | {bad} |"
        )
    lines += [
        "",
        "Not counted: transformers itself cannot build these default configs, or run them "
        "eagerly at full size (its own error), and no built-in config of the type runs:",
        "",
        "| model type | class | transformers' error |",
        "|---|---|---|",
        *apart,
        "",
        "Not counted either: classes with no forward a calibration can run on their own:",
        "",
        "| model type | class | why |",
        "|---|---|---|",
        *standalone,
    ]
    return "\n".join(lines + _decisions_lines(summary))


def saved_sweep_table(path: Path) -> str:
    """The README's table from the sweep document saved at ``path`` (``coverage --table``).

    A file that is not such a document (not JSON, a plain ``coverage --json``, anything else)
    is bad input naming it: :func:`sweep_table` reads the document's keys as it goes, so it
    would otherwise fail deep inside with a ``KeyError`` or ``TypeError`` that names nothing.
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BadInputError(
            f"cannot read {path} ({err.strerror or err}).",
            hint="Check the --table path.",
            param="table",
        ) from None
    try:
        return sweep_table(json.loads(data))
    except (ValueError, KeyError, TypeError, AttributeError):  # ValueError: not JSON, not text
        raise BadInputError(
            f"{path} is not a `llmc-trace coverage --all --json` document.",
            hint=f"Make one with `llmc-trace coverage --all --json > {path}`; for the "
            "built-ins' table, run `llmc-trace coverage --markdown`.",
            param="table",
        ) from None


def _decisions_lines(summary: dict[str, Any]) -> list[str]:
    """The decisions table and the risk list, when the document counted decisions."""
    counts = summary.get("decisions")
    if not counts:
        return []
    statuses = sorted({status for by_status in counts.values() for status in by_status})
    lines = [
        "",
        "Decisions of the settled traces (each `if`, loop and ternary of model code), by kind "
        "and what decided them:",
        "",
        "| kind | " + " | ".join(statuses) + " |",
        "|---|" + "---|" * len(statuses),
    ]
    for kind, by_status in counts.items():
        lines.append(f"| {kind} | " + " | ".join(str(by_status.get(s, 0)) for s in statuses) + " |")
    risks = summary.get("unguarded", [])
    lines += ["", f"Data-dependent decisions no opaque call owns: {len(risks)}."]
    lines += [f"- {r['model_type']} ({r['modality']}): {r['where']}" for r in risks]
    return lines


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")
