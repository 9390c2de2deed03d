"""Measure what keeping resume points costs a ``compress`` run, and check that a run killed
after subgraph k resumes to the uninterrupted checkpoint's bytes.

On the repository's trained reference model (``refmodel/``, 6 decoder layers: 7 subgraphs
with the embedding's), GPTQ W4A16 streamed into a checkpoint, two parts:

1. Overhead. ``--repeat`` runs with resume points and as many without (``resumable=False``),
   alternated, in this process: each run's seconds, and per subgraph the seconds and bytes a
   resume point took to save (every rank's state and the manifest) beside the checkpoint's
   own bytes. The saves are timed directly: on a shared machine two whole runs differ by more
   than the saves take, so the difference of their medians is shown, not judged; the largest the points were on disk, beside the plan's bound for them
   (``resume_point_bytes`` of the chosen pipeline's cache estimate).
2. Resume. For k in 1, the middle and the last subgraph: the CLI run in a subprocess, killed
   with SIGKILL right after its resume point for k (the resume module's test hook), then the
   same request here, which resumes: whether its safetensors bytes equal an uninterrupted
   run's, how many subgraphs it skipped, and its seconds beside the uninterrupted run's.

The run writes ``benchmarks/results/resume_overhead.json`` (``_results.Run``; ``--result``
names another path); ``tables(result)`` renders the docs' tables from that file alone.

    flock /tmp/llmc-bench.lock python benchmarks/resume_overhead.py   # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal, spread, spread_text  # noqa: E402
from compress_quality import DEFAULT_MODEL, THREADS, child_environment  # noqa: E402

SETTINGS = dict(samples=32, seq_len=256, batch_size=4, scheme="W4A16")


def digest(folder: Path) -> str:
    """One sha256 over every safetensors file of ``folder``, by name."""
    total = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        total.update(path.name.encode())
        total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


def request(model: Path, out: Path, **more: Any) -> Any:
    from llmc_trace.oneshot import CompressRequest

    return CompressRequest(model, model / "calib.npy", out, **SETTINGS, **more)


def overhead(model: Path, work: Path, repeat: int) -> dict[str, Any]:
    """Part 1: runs with and without resume points, alternated."""
    from llmc_trace.oneshot import compress

    seconds: dict[str, list[float]] = {"with": [], "without": []}
    save_seconds: list[float] = []
    save_bytes: list[float] = []
    peak = saves = checkpoint_bytes = 0
    for number in range(repeat):
        for kind in ("with", "without"):
            out = work / f"{kind}-{number}"
            result = compress(request(model, out), resumable=kind == "with")
            seconds[kind].append(result.elapsed_s)
            checkpoint_bytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))
            if result.resume is not None:
                saves = result.resume.saves
                save_seconds.append(result.resume.seconds / saves)
                save_bytes.append(result.resume.bytes_written / saves)
                peak = max(peak, result.resume.peak_bytes)
            print(f"  {kind} resume points, run {number + 1}: {result.elapsed_s:.1f} s")
    return {
        "subgraphs": saves,
        "run_s": {kind: spread(values, 2) for kind, values in seconds.items()},
        "per_subgraph_s": {
            kind: spread([v / saves for v in values], 3) for kind, values in seconds.items()
        },
        "save_s": spread(save_seconds, 4),
        "save_bytes": spread(save_bytes, 0),
        "checkpoint_bytes_per_subgraph": round(checkpoint_bytes / saves),
        "peak_resume_bytes": peak,
        "planned_resume_bytes": planned_bytes(model),
    }


def planned_bytes(model: Path) -> int:
    """The plan's bound for the resume points of this run on one rank."""
    from llmc_trace.pipelines.estimate import RunSettings
    from llmc_trace.pipelines.resume import resume_point_bytes
    from llmc_trace.plan import plan_source

    samples, seq_len, batch = SETTINGS["samples"], SETTINGS["seq_len"], SETTINGS["batch_size"]
    (plan,) = plan_source(
        str(model),
        [
            RunSettings(
                samples, seq_len, batch, streamed=True, device_is_host=True, attention="sdpa"
            )
        ],
    )
    return resume_point_bytes(plan.estimate(plan.chosen).cache_bytes, 1)


def resumed(model: Path, work: Path, subgraphs: int) -> list[dict[str, Any]]:
    """Part 2: killed after k, resumed, compared with an uninterrupted run."""
    from llmc_trace.oneshot import compress
    from llmc_trace.oneshot.resume import KILL_AFTER

    full = compress(request(model, work / "full"))
    expected = digest(work / "full")
    rows = []
    for k in sorted({1, (subgraphs + 1) // 2, subgraphs}):
        out = work / f"k{k}"
        command = [
            sys.executable, "-c", "from llmc_trace.cli.main import main; main()", "--quiet",
            "compress", "-m", str(model), "-d", str(model / "calib.npy"), "-o", str(out),
            *(f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()),
        ]  # fmt: skip
        environment = {**child_environment(), KILL_AFTER: str(k)}
        killed = subprocess.run(command, capture_output=True, text=True, env=environment)
        if killed.returncode != -signal.SIGKILL:
            raise SystemExit(f"the run to kill after {k} ended otherwise:\n{killed.stderr}")
        began = time.perf_counter()
        result = compress(request(model, out))
        assert result.resume is not None
        rows.append({
            "k": k,
            "identical": digest(out) == expected,
            "skipped": result.resume.skipped,
            "resumed_s": round(time.perf_counter() - began, 2),
            "uninterrupted_s": round(full.elapsed_s, 2),
        })  # fmt: skip
        print(f"  killed after {k}: resumed in {rows[-1]['resumed_s']} s, identical: "
              f"{rows[-1]['identical']}")  # fmt: skip
    return rows


def overhead_table(figures: dict[str, Any]) -> str:
    lines = [
        "| resume points | run (s) | per subgraph (s) | saving a point (s) | point's bytes "
        "| checkpoint's bytes per subgraph |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("without", "with"):
        saving = spread_text(figures["save_s"], ".3f") if kind == "with" else "-"
        size = _mib(figures["save_bytes"]["median"]) if kind == "with" else "-"
        lines.append(
            f"| {kind} | {spread_text(figures['run_s'][kind])} | "
            f"{spread_text(figures['per_subgraph_s'][kind], '.2f')} | {saving} | {size} | "
            f"{_mib(figures['checkpoint_bytes_per_subgraph'])} |"
        )
    lines.append("")
    lines.append(
        f"Largest on disk: {_mib(figures['peak_resume_bytes'])}; the plan's bound: "
        f"{_mib(figures['planned_resume_bytes'])}."
    )
    return "\n".join(lines)


def resume_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| killed after subgraph | skipped on resume | resumed run (s) | uninterrupted run (s) "
        "| checkpoint bytes identical |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['k']} | {row['skipped']} | {row['resumed_s']:.1f} | "
            f"{row['uninterrupted_s']:.1f} | {'yes' if row['identical'] else '**no**'} |"
        )
    return "\n".join(lines)


def _mib(count: float) -> str:
    return f"{count / 2**20:.2f} MiB"


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``overhead`` (part 1) and ``resume`` (part 2: one row per k)."""
    figures = result["figures"]
    return {
        "overhead": overhead_table(figures["overhead"]),
        "resume": resume_table(figures["resume"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument(
        "--result", type=Path, help="where the result goes (default benchmarks/results/"
        "resume_overhead.json)",
    )  # fmt: skip
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    run = Run("resume_overhead")
    import torch

    torch.set_num_threads(THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    model = args.model_dir.resolve()
    print(f"refmodel {model}; {SETTINGS}; load average at start: {run.load_before}")
    with tempfile.TemporaryDirectory(prefix="resume_overhead_") as name:
        cost = overhead(model, Path(name), args.repeat)
        rows = resumed(model, Path(name), cost["subgraphs"])
    with_s = cost["run_s"]["with"]["median"]
    saving = cost["save_s"]["median"] * cost["subgraphs"]
    figures = {"model": "refmodel", "settings": SETTINGS, "overhead": cost, "resume": rows}
    goals = [
        goal(
            "resumed checkpoint bytes",
            "equal to the uninterrupted run's for every k",
            ", ".join(f"k={r['k']}: {'equal' if r['identical'] else 'differ'}" for r in rows),
            all(r["identical"] for r in rows),
        ),
        goal(
            "resumed runs skip the finished subgraphs",
            "skipped = k",
            ", ".join(f"k={r['k']}: {r['skipped']}" for r in rows),
            all(r["skipped"] == r["k"] for r in rows),
        ),
        goal(
            "time saving the resume points takes",
            "under 5 % of the run (medians)",
            f"{100 * saving / with_s:.1f} % ({saving:.2f} s of {with_s:.1f} s)",
            saving < 0.05 * with_s,
        ),
        goal(
            "plan's bound on the resume points' disk",
            "at least the largest measured",
            f"{_mib(cost['planned_resume_bytes'])} vs {_mib(cost['peak_resume_bytes'])}",
            cost["planned_resume_bytes"] >= cost["peak_resume_bytes"],
        ),
    ]
    path = run.write(figures, goals=goals, path=args.result)
    result = {"figures": figures}
    for text in tables(result).values():
        print(text, end="\n\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
