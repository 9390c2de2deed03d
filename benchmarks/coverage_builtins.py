"""``llmc-trace coverage`` over every built-in model and modality: which trace, verify, how fast.

``llmc-trace --quiet coverage --json`` attempts every built-in (model, modality) pair, retrying
a failure with the fix search: the full-size config traced on ``meta``, the tiny twin replayed
against eager. It runs ``--runs`` times (default 3), each in a fresh process as a user runs it,
and each run's wall seconds, CPU seconds (user + system of that process, from ``wait4``) and
peak resident set are kept. The outcome of each pair (traced, verified, subgraphs, fix, why
not) is the first run's; a pair whose outcome differs between runs is named in the notes. Its
``trace s`` (the trace that settled the row, fix included) and ``seconds`` (the whole attempt,
fix search and twin verification included) are spreads over the runs.

The figures go to ``benchmarks/results/coverage_builtins.json`` (``--result`` names another
file); ``tables(result)`` renders the tables printed here and in the docs from it: ``rows``,
the package's own table (``llmc_trace.attempt.coverage.coverage_markdown``, what
``coverage --markdown`` prints) with each pair's median seconds, and ``summary``.

    python benchmarks/coverage_builtins.py                # every built-in, 3 runs
    python benchmarks/coverage_builtins.py --runs 1 --models facebook/opt-125m --result /tmp/c.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, spread, spread_text  # noqa: E402
from _worker import run_measured  # noqa: E402

CLI = Path(sys.executable).with_name("llmc-trace")  # the command a user types, as installed
#: What decides a pair's row, apart from its timings: these must agree between runs.
OUTCOME_KEYS = ("traced", "verified", "subgraphs", "fix", "problem")


def run_coverage(models: list[str]) -> dict[str, Any]:
    """One ``coverage --json`` in a fresh process: its rows, wall and CPU seconds, peak RSS."""
    command = [str(CLI), "--quiet", "coverage", "--json"]
    for model in models:
        command += ["--model", model]
    stdout, measured = run_measured(command, "coverage")
    return {"rows": json.loads(stdout)["rows"], **measured}


def merge_rows(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The first run's rows with ``trace_s`` and ``seconds`` as spreads over every run, and
    the pairs whose outcome differed between runs."""
    rows, changed = [], []
    for index, first in enumerate(runs[0]["rows"]):
        same = [run["rows"][index] for run in runs]
        label = f"{first['model']} · {first['modality']}"
        if any((r["model"], r["modality"]) != (first["model"], first["modality"]) for r in same):
            raise RuntimeError(f"the runs listed different pairs at row {index} ({label})")
        if any(any(r[key] != first[key] for key in OUTCOME_KEYS) for r in same):
            outcomes = "; ".join(
                f"run {n + 1}: " + ", ".join(f"{k}={r[k]!r}" for k in OUTCOME_KEYS)
                for n, r in enumerate(same)
            )
            changed.append(f"{label}: {outcomes}")
        rows.append(
            {
                **first,
                "trace_s": spread((r["trace_s"] for r in same), digits=3),
                "seconds": spread((r["seconds"] for r in same), digits=2),
            }
        )
    return rows, changed


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``rows``: one row per (model, modality) pair, median seconds over the runs (the
    package's own ``coverage --markdown`` table); ``summary``: how many pairs verify, and the
    whole run's wall and CPU seconds and peak memory."""
    from llmc_trace.attempt.coverage import CoverageRow, coverage_markdown

    figures = result["figures"]
    rows = [
        CoverageRow(**{**r, "trace_s": r["trace_s"]["median"], "seconds": r["seconds"]["median"]})
        for r in figures["rows"]
    ]
    verified = sum(r.verified for r in rows)
    summary = [
        "| pairs verified | whole run s | CPU s | peak memory GiB | runs |",
        "|---|---|---|---|---|",
        f"| {verified} of {len(rows)} pairs verify | {spread_text(figures['wall_s'], '.0f')} "
        f"| {spread_text(figures['cpu_s'], '.0f')} | {spread_text(figures['peak_rss_gib'], '.2f')} "
        f"| {figures['runs']} |",
    ]
    return {"rows": coverage_markdown(rows), "summary": "\n".join(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="whole coverage runs (fresh processes)")
    parser.add_argument("--models", nargs="+", default=[], help="built-ins (default: every one)")
    parser.add_argument(
        "--result", type=Path, help="where to write the result (default: benchmarks/results/)"
    )
    args = parser.parse_args()
    run = Run("coverage_builtins")
    runs = []
    for index in range(args.runs):
        runs.append(run_coverage(args.models))
        measured = runs[-1]
        print(
            f"run {index + 1}: {measured['wall_s']:.0f} s wall, {measured['cpu_s']:.0f} CPU s, "
            f"peak {measured['peak_rss_gib']:.2f} GiB",
            file=sys.stderr,
        )
    rows, changed = merge_rows(runs)
    figures = {
        "runs": args.runs,
        "models": args.models,  # none named: every built-in
        "wall_s": spread((r["wall_s"] for r in runs), digits=1),
        "cpu_s": spread((r["cpu_s"] for r in runs), digits=1),
        "peak_rss_gib": spread((r["peak_rss_gib"] for r in runs), digits=3),
        "pairs": len(rows),
        "verified": sum(r["verified"] for r in rows),
        "rows": rows,
    }
    rendered = tables({"figures": figures})
    print(rendered["rows"])
    print()
    print(rendered["summary"])
    notes = [f"A pair's outcome differed between runs: {line}" for line in changed]
    for note in notes:
        print(note)
    run.write(figures, notes=notes, path=args.result)


if __name__ == "__main__":
    main()
