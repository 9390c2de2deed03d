"""The smooth -> balance pairs of every built-in text model, found and proved, as ``coverage`` counts them.

``llmc-trace --quiet coverage --json --modality text`` attempts every built-in model's text
modality and, for each one that traces, reads its AWQ / SmoothQuant pairs from a trace into
every linear layer of the full-size model and proves each on the tiny twin by folding a scale
(``plan --mappings`` shows the same). This script runs it once in a fresh process and keeps,
per model, the pairs proved, the pairs left out with their reasons, and the seconds counting
them took beside the seconds of the attempt itself: what counting pairs adds to ``coverage``.

    python benchmarks/smoothing_pairs.py                            # every built-in
    python benchmarks/smoothing_pairs.py --models Qwen/Qwen3-0.6B --result /tmp/p.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal  # noqa: E402
from _worker import run_measured  # noqa: E402

CLI = Path(sys.executable).with_name("llmc-trace")  # the command a user types, as installed
KEYS = ("model", "model_type", "traced", "verified", "seconds", "pairs", "pairs_skipped",
        "pairs_note", "pairs_fix", "pairs_s")  # fmt: skip


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``pairs``: per built-in text model that traces, the pairs proved and those left out
    with why; ``summary``: how many models have pairs, and what counting them costs."""
    figures = result["figures"]
    rows = figures["rows"]
    lines = [
        "| model | architecture | pairs proved | left out | why left out | read with |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["traced"]:
            continue
        proved = "" if r["pairs"] is None else str(r["pairs"])
        why = r["pairs_note"].replace("|", "\\|").replace("not smoothed: ", "")
        fix = ", ".join(f"`{entry}`" for entry in r.get("pairs_fix", []))
        lines.append(
            f"| {r['model']} | {r['model_type']} | {proved} | {r['pairs_skipped']} | {why} "
            f"| {fix} |"
        )
    traced = [r for r in rows if r["traced"]]
    counted = [r for r in traced if r["pairs"]]
    summary = [
        "| text models traced | with pairs found and proved | pairs proved | left out "
        "| attempts s | counting pairs s |",
        "|---|---|---|---|---|---|",
        f"| {len(traced)} | {len(counted)} | {sum(r['pairs'] or 0 for r in traced)} "
        f"| {sum(r['pairs_skipped'] for r in traced)} | {figures['attempt_s']:.0f} "
        f"| {figures['pairs_s']:.0f} (+{100 * figures['pairs_s'] / figures['attempt_s']:.0f} %) |",
    ]
    return {"pairs": "\n".join(lines), "summary": "\n".join(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[], help="built-ins (default: every one)")
    parser.add_argument(
        "--result", type=Path, help="where to write the result (default: benchmarks/results/)"
    )
    args = parser.parse_args()
    run = Run("smoothing_pairs")
    command = [str(CLI), "--quiet", "coverage", "--json", "--modality", "text", "--pairs"]
    for model in args.models:
        command += ["--model", model]
    stdout, measured = run_measured(command, "coverage")
    rows = [{key: row[key] for key in KEYS} for row in json.loads(stdout)["rows"]]
    traced = [r for r in rows if r["traced"]]
    figures = {
        "models": args.models,  # none named: every built-in
        "rows": rows,
        "wall_s": round(measured["wall_s"], 1),
        "cpu_s": round(measured["cpu_s"], 1),
        "peak_rss_gib": round(measured["peak_rss_gib"], 3),
        "attempt_s": round(sum(r["seconds"] for r in rows), 1),
        "pairs_s": round(sum(r["pairs_s"] for r in rows), 1),
    }
    uncounted = [r["model"] for r in traced if r["pairs"] is None]
    without = [r["model"] for r in traced if r["pairs"] == 0]
    goals = [
        goal(
            "the trace into the layers reads every built-in text model that traces",
            "pairs counted for every traced text model",
            f"{len(traced) - len(uncounted)} of {len(traced)}",
            not uncounted,
        )
    ]
    rendered = tables({"figures": figures})
    print(rendered["pairs"])
    print()
    print(rendered["summary"])
    notes = [f"Not counted: {', '.join(uncounted)}"] if uncounted else []
    notes += [f"No pair proved (the table says why): {', '.join(without)}"] if without else []
    run.write(figures, goals=goals, notes=notes, path=args.result)


if __name__ == "__main__":
    main()
