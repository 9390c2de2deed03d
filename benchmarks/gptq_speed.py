"""Time GPTQ per layer against a plain fp32 matmul of the same size, on CPU and on CUDA if present.

For each weight shape (out x in, as `nn.Linear.weight`), W is random, H comes from 2048 random
input tokens, and GPTQ quantizes W to W4A16 (group 128, static act-order). The reference is
W @ X^T with X of the same 2048 tokens, timed in the same process, so the ratio says how many
forward matmuls one GPTQ call costs on this machine. Each measurement runs in a fresh
subprocess, so its peak memory (CUDA: peak allocated; CPU: peak resident set of the whole
process, torch included) is its own.

    python benchmarks/gptq_speed.py                # 4096x4096, 4096x14336, 14336x4096
    python benchmarks/gptq_speed.py --quick        # about a quarter of each dimension
    python benchmarks/gptq_speed.py --threads 1    # CPU threads (default: torch's)

On a CPU shared with other busy processes, prefer --threads 1: the column sweep is thousands of
small ops, and with several OpenMP threads each op waits for the slowest, descheduled thread
(1024 x 1024 measured 25 s with 2 threads under load against 0.4 s with 1).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from llmc_trace.algorithms import W4A16, HessianAccumulator, gptq

FULL_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
QUICK_SHAPES = [(1024, 1024), (1024, 3584), (3584, 1024)]
TOKENS = 2048


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(out_features: int, in_features: int, device: str) -> dict[str, float]:
    """GPTQ and matmul seconds, and peak memory, for one shape on one device."""
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

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    gptq(W, accumulator.H, W4A16.weights)
    synchronize(device)
    gptq_s = time.perf_counter() - start

    if device == "cuda":
        peak_bytes = torch.cuda.max_memory_allocated()
    else:
        peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"gptq_s": gptq_s, "matmul_s": matmul_s, "peak_bytes": peak_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes (1024, 3584)")
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
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {TOKENS} tokens")
    if torch.cuda.is_available():
        print(f"cuda: {torch.cuda.get_device_name()}")
    header = f"{'device':6} {'shape (out x in)':>18} {'gptq s':>9} {'matmul s':>9} {'ratio':>8}"
    print(header + f" {'peak MiB':>9}")
    for device in devices:
        for out_features, in_features in shapes:
            command = [sys.executable, __file__, "--one", str(out_features), str(in_features)]
            command += [device, *(["--threads", str(args.threads)] if args.threads else [])]
            child = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(child.stdout.strip().splitlines()[-1])
            ratio = result["gptq_s"] / result["matmul_s"]
            print(
                f"{device:6} {f'{out_features} x {in_features}':>18} {result['gptq_s']:9.3f} "
                f"{result['matmul_s']:9.5f} {ratio:8.0f} {result['peak_bytes'] / 2**20:9.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
