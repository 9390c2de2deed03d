"""How many of GPTQ's integers a tiny change of the Hessian flips: the noise a device bound must allow.

Two devices (or two BLAS builds, or two batch sizes) factor the same Hessian and multiply the
same blocks with their own summation order. GPTQ's rounding is chaotic in that noise: a weight
near a tie that flips changes its row's error stream for every later column. The tests that
compare GPTQ across devices (``tests/algorithms/test_gptq.py::test_gptq_on_cuda_matches_cpu``)
bound the share of integers that may differ; this benchmark measures what float noise alone
does on the very problem those tests use (``make_correlated_inputs``: 2,048 tokens of 256
correlated features with outlier channels, a 128 x 256 weight), so the bound can be set well
above it and well below what a wrong path changes.

For each relative size ``eps``, the Hessian is perturbed elementwise by ``eps`` times itself
times a symmetric standard normal matrix, for several seeds, and the share of integers that
differ from the unperturbed solve is recorded (4-bit, groups of 128, static act-order, as the
device test runs). Writes ``benchmarks/results/gptq_chaos.json``.

    python benchmarks/gptq_chaos.py              # eps 1e-6, 1e-5, 1e-4; 5 seeds each
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "algorithms"))
from _results import Run, spread  # noqa: E402

EPSILONS = (1e-6, 1e-5, 1e-4)


def flipped_shares(eps: float, seeds: int) -> list[float]:
    """The share of integers that differ from the unperturbed solve, one per seed."""
    import torch
    from _compress_data import hessian, make_correlated_inputs

    from llmc_trace.algorithms import QuantizationArgs, gptq

    W = torch.randn(128, 256, generator=torch.Generator().manual_seed(0)) * 0.02
    H = hessian(make_correlated_inputs(2048, 256, 0))
    args = QuantizationArgs(num_bits=4, actorder="static")
    reference = gptq(W, H, args).quantized.int_weight
    shares = []
    for seed in range(seeds):
        noise = torch.randn(H.shape, generator=torch.Generator().manual_seed(1000 + seed))
        noise = (noise + noise.T) / 2
        perturbed = gptq(W, H + eps * H * noise, args).quantized.int_weight
        shares.append((perturbed != reference).float().mean().item())
    return shares


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The flipped share for each perturbation size: median (min-max) over the seeds."""
    lines = [
        "| Hessian perturbed by | integers flipped, median (min-max) | seeds |",
        "|---|---|---|",
    ]
    for row in result["figures"]["rows"]:
        s = row["flipped_percent"]
        lines.append(
            f"| {row['eps']:.0e} of itself | {s['median']:.3f} % ({s['min']:.3f}-{s['max']:.3f} %)"
            f" | {s['runs']} |"
        )
    return {"flips": "\n".join(lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="perturbations per size (default 5)")
    args = parser.parse_args()
    run = Run("gptq_chaos")
    import torch

    torch.manual_seed(0)
    rows = []
    for eps in EPSILONS:
        shares = flipped_shares(eps, args.seeds)
        rows.append({"eps": eps, "flipped_percent": spread([100 * s for s in shares])})
    result = {"figures": {"rows": rows, "problem": "128 x 256 weight, 2048 x 256 inputs, W4 g128 static act-order"}}
    print(tables(result)["flips"])
    run.write(result["figures"])


if __name__ == "__main__":
    main()
