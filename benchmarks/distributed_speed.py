"""The same GPTQ compress on 1 and on N ranks (torchrun, gloo on CPU, one thread per rank).

    python benchmarks/distributed_speed.py                  # the reference model, 128 x 512
    python benchmarks/distributed_speed.py --ranks 2 --samples 64

Every run is a fresh ``torchrun`` with the same total samples; each rank reports its wall
seconds, its peak resident set, and how many batches it calibrated on. Rank 0 then scores the
written checkpoint's perplexity on the model's ``eval.npy``, beside the one-process run's and
round-to-nearest's: the ranks' result must beat RTN and stay within float-order noise of one
process (summation order changes between the two, as it does between batch sizes).
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

from refmodel import FOLDER as DEFAULT_MODEL

import _worker

MiB = 2**20
SEQ_LEN = 512


def rank_worker(model: str, out: str, method: str, samples: int) -> None:
    """Inside one rank: compress, then report (rank 0 also scores the checkpoint)."""
    import numpy as np
    import torch

    from llmc_trace.core.world import join_from_environment
    from llmc_trace.oneshot import CompressRequest, compress

    world = join_from_environment()
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
    # compressed-tensors loads a checkpoint with collectives when a process group exists:
    # rank 0 scores alone, after the group is gone
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if world.is_main:
        from llmc_trace.evaluate import evaluate_model

        scored = evaluate_model(  # float32, as compress_quality scores every row
            out, str(Path(model) / "eval.npy"), batch_size=8, dtype=torch.float32
        )
        result["ppl"] = scored.perplexity
        result["eval_rows"] = int(np.load(Path(model) / "eval.npy").shape[0])
    print("RESULT " + json.dumps(result), flush=True)


def run(model: Path, ranks: int, method: str, samples: int, folder: Path) -> list[dict]:
    """One torchrun of ``ranks`` ranks; the RESULT line of each rank."""
    out = folder / f"{method}-{ranks}"
    shutil.rmtree(out, ignore_errors=True)
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--nproc-per-node", str(ranks), "--no-python", sys.executable]
    command += [__file__]
    command += ["--worker", str(model), str(out), method, str(samples)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    child = subprocess.run(command, capture_output=True, text=True, env=environment)
    wall = time.perf_counter() - start
    results = [
        json.loads(line.removeprefix("RESULT "))
        for line in child.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    if child.returncode != 0 or len(results) != ranks:
        tail = " | ".join((child.stderr or child.stdout).strip().splitlines()[-3:])
        raise SystemExit(f"{method} on {ranks} ranks failed (exit {child.returncode}): {tail}")
    for result in results:
        result["wall_s"] = wall
    return sorted(results, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the parallel run")
    parser.add_argument("--samples", type=int, default=128, help="calibration rows in all")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
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
    model = args.model_dir.resolve()
    print(f"{model}; {args.samples} x {SEQ_LEN} calibration tokens; one thread per rank")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="distributed_speed_") as folder:
        rtn = run(model, 1, "rtn", args.samples, Path(folder))[0]
        alone = run(model, 1, "gptq", args.samples, Path(folder))
        ranks = run(model, args.ranks, "gptq", args.samples, Path(folder))
    print()
    print(
        "| run | wall s (torchrun) | compress s per rank | peak RSS MiB per rank | batches per rank | ppl |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| RTN, 1 rank | {rtn['wall_s']:.1f} | {rtn['seconds']:.1f} | "
        f"{rtn['peak_rss_bytes'] / MiB:.0f} | - | {rtn['ppl']:.3f} |"
    )
    for label, results in (("GPTQ, 1 rank", alone), (f"GPTQ, {args.ranks} ranks", ranks)):
        seconds = " / ".join(f"{r['seconds']:.1f}" for r in results)
        peaks = " / ".join(f"{r['peak_rss_bytes'] / MiB:.0f}" for r in results)
        batches = " / ".join(str(r["batches"]) for r in results)
        print(
            f"| {label} | {results[0]['wall_s']:.1f} | {seconds} | {peaks} | {batches} | "
            f"{results[0]['ppl']:.3f} |"
        )
    speedup = alone[0]["seconds"] / max(r["seconds"] for r in ranks)
    print(
        f"\ncompress speed-up at {args.ranks} ranks: {speedup:.2f}x (slowest rank); "
        f"perplexity {ranks[0]['ppl']:.3f} against one process {alone[0]['ppl']:.3f} "
        f"(difference {ranks[0]['ppl'] - alone[0]['ppl']:+.3f}) and RTN {rtn['ppl']:.3f}"
    )
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
