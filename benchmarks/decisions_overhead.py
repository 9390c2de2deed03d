"""What recording decisions costs a trace, on every built-in (model, modality) pair.

Each pair's full-size model is built on ``meta`` and traced on ``attempt``'s default sample
(:func:`llmc_trace.traced.probe.sample_for`) with ``record_decisions`` off and on, alternating
(one warm-up trace first, then ``--runs`` of each), in this one process; the figure is the ratio
of the medians, with the decisions counted per status. A pair that does not trace as written
still counts: the decisions up to where it stopped are recorded alike. Goal: recording within
20 % of the trace time (``overhead`` below 0.2 at the median pair).

    python benchmarks/decisions_overhead.py            # every pair, 2 runs each
    python benchmarks/decisions_overhead.py --runs 3 --models meta-llama/Llama-3.1-8B-Instruct
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal, spread  # noqa: E402

TARGET = 0.20


def measure(name: str, modality: str, runs: int) -> dict[str, Any]:
    """Trace times with recording off and on, and the decisions of the last recorded trace."""
    from llmc_trace.errors import TraceStopped
    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.samples import SampleOptions
    from llmc_trace.models.source import resolve_model
    from llmc_trace.traced.probe import sample_for
    from llmc_trace.tracing.options import TracingOptions
    from llmc_trace.tracing.trace import trace_graph

    model = build_meta_model(resolve_model(name))
    sample = sample_for(model, modality, SampleOptions())
    off = TracingOptions.parse(model, [], None, 1)
    on = dataclasses.replace(off, record_decisions=True)

    def trace(options: TracingOptions) -> tuple[float, list[Any], str]:
        """Seconds, decisions, and where the trace stopped ("" when it did not)."""
        start = time.perf_counter()
        try:
            decisions, stopped_at = trace_graph(model, sample, options).decisions, ""
        except TraceStopped as stopped:
            decisions, stopped_at = stopped.decisions, f"{type(stopped.cause).__name__}"
        return time.perf_counter() - start, decisions, stopped_at

    first_s = trace(on)[0]  # lazy imports, first meta kernels, model files compiled or read
    times: dict[bool, list[float]] = {False: [], True: []}
    decisions: list[Any] = []
    outcomes = set()
    for _ in range(runs):
        elapsed, _, stopped_off = trace(off)
        times[False].append(elapsed)
        elapsed, decisions, stopped_on = trace(on)
        times[True].append(elapsed)
        outcomes.add((stopped_off, stopped_on))
    counts: dict[str, int] = {}
    for decision in decisions:
        counts[decision.status] = counts.get(decision.status, 0) + 1
    return {
        "model": name,
        "modality": modality,
        "off_s": spread(times[False]),
        "on_s": spread(times[True]),
        "first_on_s": round(first_s, 4),
        "overhead": round(statistics.median(times[True]) / statistics.median(times[False]) - 1, 3),
        "decisions": counts,
        "unguarded": sum(1 for d in decisions if d.unguarded),
        # recording must never change what the trace does: same failure (or none) either way
        "same_outcome": all(off == on for off, on in outcomes),
        "stopped": sorted({on for _, on in outcomes if on}),
    }


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``summary`` (the overhead over all pairs) and ``pairs`` (one row per pair)."""
    rows = [r for r in result["figures"]["pairs"] if "overhead" in r]
    overheads = sorted(r["overhead"] for r in rows)
    summary = [
        "| pairs | median overhead | min | max | decisions per trace (median) "
        "| unguarded data-dependent |",
        "|---|---|---|---|---|---|",
        f"| {len(rows)} | {statistics.median(overheads):.0%} | {overheads[0]:.0%} "
        f"| {overheads[-1]:.0%} "
        f"| {statistics.median(sum(r['decisions'].values()) for r in rows):.0f} "
        f"| {sum(r['unguarded'] for r in rows)} |",
    ]
    pairs = [
        "| model | modality | trace s (off) | trace s (on) | overhead | decisions |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(r["decisions"].items()))
        pairs.append(
            f"| {r['model']} | {r['modality']} | {r['off_s']['median']:.2f} "
            f"| {r['on_s']['median']:.2f} | {r['overhead']:.0%} | {counts} |"
        )
    return {"summary": "\n".join(summary), "pairs": "\n".join(pairs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--models", nargs="*", help="built-in names (default: every built-in)")
    parser.add_argument("--result", type=Path, help="where to write the result file")
    args = parser.parse_args()

    from llmc_trace.models.samples import supported_modalities
    from llmc_trace.models.source import builtin_names, resolve_model

    run = Run("decisions_overhead")
    pairs = []
    for name in args.models or builtin_names():
        for modality in supported_modalities(resolve_model(name).config()):
            try:
                pairs.append(measure(name, modality, args.runs))
            except Exception as err:  # one pair's crash must not hide the others' figures
                pairs.append(
                    {
                        "model": name,
                        "modality": modality,
                        "error": f"{type(err).__name__}: {err}"[:200],
                    }
                )
            print(pairs[-1].get("overhead", pairs[-1].get("error")), name, modality, flush=True)
    measured = [p["overhead"] for p in pairs if "overhead" in p]
    median = statistics.median(measured)
    figures = {"runs": args.runs, "pairs": pairs}
    changed = [f"{p['model']} ({p['modality']})" for p in pairs if p.get("same_outcome") is False]
    goals = [
        goal(
            "recording decisions costs a trace little",
            f"median overhead under {TARGET:.0%}",
            f"{median:.0%} over {len(measured)} pairs",
            median < TARGET,
        ),
        goal(
            "recording never changes a trace's outcome",
            "every pair traces (or stops) alike with recording on and off",
            f"{len(changed)} pairs differ" + (f": {', '.join(changed)}" if changed else ""),
            not changed,
        ),
    ]
    notes = [
        "Times after one warm-up trace; the first trace of a process also reads each model "
        "file's instrumented code from the cache (or compiles it once)."
    ]
    run.write(figures, goals=goals, notes=notes, path=args.result)
    for name, table in tables({"figures": figures}).items():
        print(f"\n{name}\n{table}")


if __name__ == "__main__":
    main()
