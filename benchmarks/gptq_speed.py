"""Time GPTQ per layer against a plain fp32 matmul, and against an earlier commit's GPTQ.

For each weight shape (out x in, as `nn.Linear.weight`), W is random (bf16, as a checkpoint
holds it), H comes from 2048 random input tokens, and GPTQ quantizes W to W4A16 (group 128,
static act-order). Two seconds are measured per call: `gptq` alone, and `gptq` with the
report's round-to-nearest baseline as `compress` obtains it (`gptq(..., baseline=True)`, or,
for sources older than that argument, `damped_error(W, baseline_weight(W, args), H)` before the
call). The reference is W @ X^T with X of the same 2048 tokens, timed in the same process, so
the ratio says how many forward matmuls one GPTQ call costs on this machine. Each measurement
runs in a fresh subprocess, so its peak memory (CUDA: peak allocated; CPU: peak resident set
of the whole process, torch included) is its own.

    python benchmarks/gptq_speed.py                  # 4096x4096, 4096x14336, 14336x4096
    python benchmarks/gptq_speed.py --quick          # about a quarter of each dimension
    python benchmarks/gptq_speed.py --shapes refmodel --against 4b67272 --repeat 5
    python benchmarks/gptq_speed.py --threads 1      # CPU threads (default: torch's)

`--against REV` extracts `src/` of that git revision into a temporary folder and times it too,
the two sources alternating shape by shape and repeat by repeat, so that a change in the
machine's load reaches both; each source's fastest repeat is printed, then new/old ratios.
Seconds are wall-clock and the process's CPU time: with one thread on a machine other
processes crowd, the CPU seconds are the steadier measure of the work done.

On a CPU shared with other busy processes, prefer --threads 1: the column sweep is thousands of
small ops, and with several OpenMP threads each op waits for the slowest, descheduled thread
(1024 x 1024 measured 25 s with 2 threads under load against 0.4 s with 1).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

FULL_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
QUICK_SHAPES = [(1024, 1024), (1024, 3584), (3584, 1024)]
REFMODEL_SHAPES = [(256, 256), (128, 256), (768, 256), (256, 768)]
"""The reference model's projections: q and o, k and v, gate and up, down."""
SHAPES = {"full": FULL_SHAPES, "quick": QUICK_SHAPES, "refmodel": REFMODEL_SHAPES}
TOKENS = 2048
REPO = Path(__file__).resolve().parent.parent


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(out_features: int, in_features: int, device: str) -> dict[str, float]:
    """GPTQ seconds (alone, with the baseline) and matmul seconds, for one shape on one device,
    with the llmc_trace found first on sys.path."""
    from llmc_trace.algorithms import W4A16, HessianAccumulator, gptq

    generator = torch.Generator(device=device).manual_seed(0)
    W = 0.02 * torch.randn(out_features, in_features, generator=generator, device=device)
    X = torch.randn(TOKENS, in_features, generator=generator, device=device)
    accumulator = HessianAccumulator(in_features, device=device)
    accumulator.add(X)

    matmul_s = float("inf")
    for _ in range(4):  # the first call warms up; keep the fastest of the others
        synchronize(device)
        start = time.perf_counter()
        W @ X.T
        synchronize(device)
        matmul_s = min(matmul_s, time.perf_counter() - start)
    W = W.to(torch.bfloat16)  # as a checkpoint holds it

    warm = torch.randn(64, 128, generator=generator, device=device)  # first calls' set-up
    gptq(warm, torch.eye(128, device=device), W4A16.weights)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def timed(call: Callable[[], object]) -> tuple[float, float]:
        synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        call()
        synchronize(device)
        return time.perf_counter() - start, time.process_time() - cpu_start

    def with_baseline() -> None:
        if "baseline" in inspect.signature(gptq).parameters:
            gptq(W, accumulator.H.clone(), W4A16.weights, overwrite_hessian=True, baseline=True)
            return
        # the report's baseline as compress computed it before gptq could measure it
        from llmc_trace.algorithms.baseline import baseline_weight, damped_error

        H = accumulator.H.clone()
        damped_error(W, baseline_weight(W, W4A16.weights), H)
        gptq(W, H, W4A16.weights, overwrite_hessian=True)

    gptq_s, gptq_cpu_s = timed(
        lambda: gptq(W, accumulator.H.clone(), W4A16.weights, overwrite_hessian=True)
    )
    with_baseline_s, with_baseline_cpu_s = timed(with_baseline)

    if device == "cuda":
        peak_bytes = torch.cuda.max_memory_allocated()
    else:
        peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {
        "gptq_s": gptq_s,
        "with_baseline_s": with_baseline_s,
        "gptq_cpu_s": gptq_cpu_s,
        "with_baseline_cpu_s": with_baseline_cpu_s,
        "matmul_s": matmul_s,
        "peak_bytes": peak_bytes,
    }


def extract_source(revision: str, folder: Path) -> Path:
    """`src/` of `revision` written under `folder`; returns the path to put on PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "src"


def run_child(source: Path, shape: tuple[int, int], device: str, threads: int | None) -> dict:
    command = [sys.executable, __file__, "--one", str(shape[0]), str(shape[1]), device]
    command += ["--threads", str(threads)] if threads else []
    environment = {**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{REPO}"}
    child = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes (1024, 3584)")
    parser.add_argument(
        "--shapes", choices=sorted(SHAPES), help="shape set (default: full, or quick)"
    )
    parser.add_argument("--against", metavar="REV", help="also time src/ of this git revision")
    parser.add_argument("--repeat", type=int, default=1, help="runs per shape and source")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--one", nargs=3, metavar=("OUT", "IN", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.one:
        out_features, in_features, device = int(args.one[0]), int(args.one[1]), args.one[2]
        print(json.dumps(measure(out_features, in_features, device)))
        return

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    shapes = SHAPES[args.shapes or ("quick" if args.quick else "full")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {TOKENS} tokens")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if torch.cuda.is_available():
        print(f"cuda: {torch.cuda.get_device_name()}")
    with tempfile.TemporaryDirectory() as folder:
        sources = {"new": REPO / "src"}
        if args.against:
            sources = {args.against: extract_source(args.against, Path(folder)), **sources}
        header = f"{'device':6} {'shape (out x in)':>18} {'source':>8} {'gptq s':>9}"
        header += f" {'+baseline s':>11} {'gptq cpu s':>10} {'+baseline cpu s':>15}"
        print(header + f" {'matmul s':>9} {'ratio':>7} {'peak MiB':>9}")
        timings = ("gptq_s", "with_baseline_s", "gptq_cpu_s", "with_baseline_cpu_s")
        for device in devices:
            for shape in shapes:
                best: dict[str, dict] = {}
                for _ in range(args.repeat):
                    for name, source in sources.items():  # alternating: load reaches both
                        result = run_child(source, shape, device, args.threads)
                        kept = best.setdefault(name, result)
                        for key in timings:
                            kept[key] = min(kept[key], result[key])
                for name, r in best.items():
                    print(
                        f"{device:6} {f'{shape[0]} x {shape[1]}':>18} {name:>8} "
                        f"{r['gptq_s']:9.3f} {r['with_baseline_s']:11.3f} "
                        f"{r['gptq_cpu_s']:10.3f} {r['with_baseline_cpu_s']:15.3f} "
                        f"{r['matmul_s']:9.5f} {r['gptq_s'] / r['matmul_s']:7.0f} "
                        f"{r['peak_bytes'] / 2**20:9.0f}",
                        flush=True,
                    )
                if args.against:
                    old, new = best[args.against], best["new"]
                    ratios = [f"{new[key] / old[key]:{width}.2f}" for key, width in
                              zip(timings, (9, 11, 10, 15))]  # fmt: skip
                    print(f"{'':6} {'':18} {'new/old':>8} {' '.join(ratios)}", flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
