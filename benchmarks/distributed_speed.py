"""The same GPTQ compress on 1 and on N ranks (torchrun, gloo on CPU, one thread per rank).

    python benchmarks/distributed_speed.py                  # the reference model, 128 x 512
    python benchmarks/distributed_speed.py --ranks 2 --samples 64 --repeat 5

Every run is a fresh ``torchrun`` with the same total samples; each rank reports its
``compress`` seconds, its peak resident set, and how many batches it calibrated on. The three
runs (round-to-nearest on one rank, GPTQ on one rank, GPTQ on N ranks) are repeated
``--repeat`` times, interleaved so a change in the machine's load reaches each of them; the
seconds are each run's spread over the repeats, and the speed-up is one rank's median over the
slowest rank's median, of the same run of this script. Once the ranks are gone (compressed-
tensors loads a checkpoint with collectives while a process group exists), this process scores
each run's last checkpoint on the model's ``eval.npy`` (float32; deterministic, so once). Two
goals are judged: the ranks' result beats RTN, and it stays within float-order noise of one
process (within 0.1 %: summation order changes between the two, as it does between batch
sizes).

The figures are written to ``benchmarks/results/distributed_speed.json`` (``--result`` names
another file); ``tables(result)`` renders the tables printed here and in the docs from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from refmodel import FOLDER as DEFAULT_MODEL

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _worker  # noqa: E402
from _results import Run, goal, spread, spread_text  # noqa: E402

MiB = 2**20
SEQ_LEN = 512
#: How far the ranks' perplexity may be from one process's: float summation order, no more.
NOISE = 1e-3


def rank_worker(model: str, out: str, method: str, samples: int) -> None:
    """Inside one rank: compress, leave the process group, report."""
    from llmc_trace.core.world import joined_from_environment
    from llmc_trace.oneshot import CompressRequest, compress

    with joined_from_environment() as world:
        start = time.perf_counter()
        request = CompressRequest(
            model, Path(model) / "calib.npy", out, method=method, samples=samples, seq_len=SEQ_LEN
        )
        compress(request)
        seconds = time.perf_counter() - start
        result = {
            "rank": world.rank,
            "seconds": seconds,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "batches": len(world.shard(list(range(samples)))),
        }
    print("RESULT " + json.dumps(result), flush=True)


def run(model: Path, ranks: int, method: str, samples: int, out: Path) -> list[dict]:
    """One torchrun of ``ranks`` ranks writing ``out``; the RESULT line of each rank."""
    shutil.rmtree(out, ignore_errors=True)
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--nproc-per-node", str(ranks), "--no-python", sys.executable]
    command += [__file__]
    command += ["--worker", str(model), str(out), method, str(samples)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    child = subprocess.run(command, capture_output=True, text=True, env=environment)
    wall = time.perf_counter() - start
    results = rank_results(child.stdout)
    if child.returncode != 0 or len(results) != ranks:
        tail = " | ".join((child.stderr or child.stdout).strip().splitlines()[-3:])
        raise SystemExit(f"{method} on {ranks} ranks failed (exit {child.returncode}): {tail}")
    for result in results:
        result["wall_s"] = wall
    return sorted(results, key=lambda r: r["rank"])


def rank_results(stdout: str) -> list[dict]:
    """Every rank's ``RESULT {json}`` in torchrun's output, where the ranks' lines can run
    into one another (they finish together, leaving the group at once)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(part)[0] for part in stdout.split("RESULT ")[1:]]


#: The three runs, in the order each repeat makes them: (key, method, ranks or None for N).
RUNS = (("rtn", "rtn", 1), ("gptq_1", "gptq", 1), ("gptq_n", "gptq", None))


def perplexity(checkpoint: Path, model: Path) -> float:
    """The checkpoint's perplexity on every row of the model's ``eval.npy``, in float32 as
    compress_quality scores."""
    import torch

    from llmc_trace.evaluate import evaluate_model

    scored = evaluate_model(
        str(checkpoint), str(model / "eval.npy"), batch_size=8, dtype=torch.float32
    )
    return scored.perplexity


def summarize(label: str, repeats: list[list[dict]], ppl: float, rows: int) -> dict[str, Any]:
    """One run's repeats: wall seconds and each rank's seconds as spreads, each rank's highest
    peak RSS, its batches; and its checkpoint's perplexity."""
    ranks = len(repeats[0])
    return {
        "label": label,
        "ranks": ranks,
        "wall_s": spread(r[0]["wall_s"] for r in repeats),
        "compress_s": [spread(r[rank]["seconds"] for r in repeats) for rank in range(ranks)],
        "slowest_rank_s": spread(max(x["seconds"] for x in r) for r in repeats),
        "peak_rss_mib": [
            round(max(r[rank]["peak_rss_bytes"] for r in repeats) / MiB, 1)
            for rank in range(ranks)
        ],
        "batches": [r["batches"] for r in repeats[0]],
        "ppl": ppl,
        "eval_rows": rows,
    }


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``speed``: each run's seconds, memory, batches and perplexity; ``summary``: the speed-up
    and the ranks' perplexity against one process and RTN."""
    figures = result["figures"]
    runs = figures["runs"]
    lines = [
        f"| run | wall s (torchrun) | compress s per rank | peak RSS MiB per rank "
        f"| batches per rank | ppl ({runs['rtn']['eval_rows']} eval rows) |",
        "|---|---|---|---|---|---|",
    ]
    for key, _, _ in RUNS:
        r = runs[key]
        seconds = " / ".join(spread_text(s) for s in r["compress_s"])
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_rss_mib"])
        batches = " / ".join(str(b) for b in r["batches"]) if key != "rtn" else "-"
        lines.append(
            f"| {r['label']} | {spread_text(r['wall_s'])} | {seconds} | {peaks} | {batches} "
            f"| {r['ppl']:.3f} |"
        )
    ranks, one = runs["gptq_n"], runs["gptq_1"]
    difference = ranks["ppl"] - one["ppl"]
    summary = [
        "| ranks | compress speed-up (1 rank / slowest rank, medians) | ppl, ranks | ppl, 1 rank "
        "| difference | ppl, RTN |",
        "|---|---|---|---|---|---|",
        f"| {ranks['ranks']} | {figures['speedup']:.2f}x | {ranks['ppl']:.3f} | {one['ppl']:.3f} "
        f"| {difference:+.3f} ({100 * difference / one['ppl']:+.3f} %) | "
        f"{runs['rtn']['ppl']:.3f} |",
    ]
    return {"speed": "\n".join(lines), "summary": "\n".join(summary)}


def judge(runs: dict[str, Any]) -> list[dict[str, Any]]:
    """The docstring's two goals for the ranks' checkpoint."""
    ranks, one, rtn = runs["gptq_n"]["ppl"], runs["gptq_1"]["ppl"], runs["rtn"]["ppl"]
    gap = abs(ranks - one) / one
    return [
        goal(
            f"GPTQ on {runs['gptq_n']['ranks']} ranks beats round-to-nearest",
            "perplexity below RTN's",
            f"{ranks:.3f} against {rtn:.3f}",
            ranks < rtn,
        ),
        goal(
            "GPTQ on ranks stays within float-order noise of one process",
            f"perplexity within {100 * NOISE:.1f} % of one process's",
            f"{ranks:.3f} against {one:.3f} ({100 * gap:.3f} %)",
            gap <= NOISE,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the parallel run")
    parser.add_argument("--samples", type=int, default=128, help="calibration rows in all")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each of the three")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument(
        "--result", type=Path, help="result file (default: benchmarks/results/<name>.json)"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        model, out, method, samples = args.worker
        try:
            rank_worker(model, out, method, int(samples))
        except Exception as err:  # reported as a result, the parent prints it
            print("RESULT " + json.dumps({"error": _worker.failure_text(err)}), flush=True)
            raise
        return
    import numpy as np

    record = Run("distributed_speed")
    model = args.model_dir.resolve()
    print(f"{model}; {args.samples} x {SEQ_LEN} calibration tokens; one thread per rank")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    repeats: dict[str, list[list[dict]]] = {key: [] for key, _, _ in RUNS}
    labels = {"rtn": "RTN, 1 rank", "gptq_1": "GPTQ, 1 rank", "gptq_n": f"GPTQ, {args.ranks} ranks"}
    rows = int(np.load(model / "eval.npy", mmap_mode="r").shape[0])  # what perplexity scores
    with tempfile.TemporaryDirectory(prefix="distributed_speed_") as folder:
        outs = {key: Path(folder) / key for key in repeats}
        for repeat in range(args.repeat):
            for key, method, ranks in RUNS:
                results = run(model, ranks or args.ranks, method, args.samples, outs[key])
                repeats[key].append(results)
                print(f"repeat {repeat + 1}: {key}: {max(r['seconds'] for r in results):.1f} s")
        runs = {
            key: summarize(labels[key], repeats[key], perplexity(outs[key], model), rows)
            for key in repeats
        }
    figures = {
        "model": model.name,
        "ranks": args.ranks,
        "samples": args.samples,
        "seq_len": SEQ_LEN,
        "threads_per_rank": 1,
        "repeat": args.repeat,
        "scheme": "W4A16",
        "runs": runs,
        "speedup": round(
            runs["gptq_1"]["compress_s"][0]["median"]
            / runs["gptq_n"]["slowest_rank_s"]["median"],
            3,
        ),
    }
    path = record.write(figures, goals=judge(runs), path=args.result)
    print()
    for table in tables(json.loads(path.read_text())).values():
        print(table + "\n")
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
