"""Check that llmc-trace's GPTQ and llm-compressor's agree, and how far float order moves both.

Two parts, on the repository's trained reference model (``refmodel/``), for 3-bit and 4-bit group-128
symmetric GPTQ with static activation order (llm-compressor's W4A16 preset at each width):

1. Same inputs, same answer. Every targeted layer's Hessian is accumulated once from the
   unquantized model on ``--samples`` calibration rows; then each layer's weight, Hessian and
   group scales go to llmc-trace's ``gptq`` and to llm-compressor's ``quantize_weight`` (in
   ``benchmarks/.venv-llmc``, through ``_reference/gptq_sweep_llmcompressor.py``). Printed: how
   many layers come out bit-identical, the fraction of weights that differ, the GPTQ objective
   ``tr((W - Q) H (W - Q)^T) / 2`` of each (float64), and the seconds of the sweeps alone.
2. Float order alone. Whole runs of both tools (``compress`` and ``oneshot``, with error
   propagation through the quantized layers, as ``compress_quality.py`` runs them) on the same
   rows at calibration batch sizes ``--batch-sizes``: batching changes no value that reaches
   GPTQ, only the order of floating-point sums, so the perplexities printed are the spread of
   each tool's result under rounding noise alone.

    python benchmarks/gptq_agreement.py                    # both parts, ~15 min on 2 cores
    python benchmarks/gptq_agreement.py --no-float-order   # part 1 only, ~1 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compress_quality import (
    DEFAULT_MODEL,
    REFERENCE_PYTHON,
    SEQ_LEN,
    THREADS,
    Setting,
    child_environment,
    load_float32,
    run_ours,
    run_theirs,
    save_calibration_rows,
)

HERE = Path(__file__).resolve().parent
SWEEP_SCRIPT = HERE / "_reference" / "gptq_sweep_llmcompressor.py"
BITS = (3, 4)
GROUP_SIZE = 128


def layer_hessians(model_dir: Path, samples: int, seed: int) -> dict[str, Any]:
    """Every targeted Linear's weight and Hessian, from the unquantized model's forward."""
    import torch

    from llmc_trace.algorithms import HessianAccumulator
    from llmc_trace.algorithms.scheme import W4A16
    from llmc_trace.data import load_calibration

    model = load_float32(model_dir)
    targets = {n: m for n, m in model.named_modules() if W4A16.is_target(n, m)}
    accumulators = {n: HessianAccumulator(m.in_features) for n, m in targets.items()}
    handles = [
        module.register_forward_pre_hook(
            lambda _, inputs, acc=accumulators[name]: acc.add(inputs[0].detach())
        )
        for name, module in targets.items()
    ]
    calibration = load_calibration(
        model_dir / "calib.npy", samples=samples, seq_len=SEQ_LEN, seed=seed
    )
    with torch.no_grad():
        for batch in calibration.batches:
            model(input_ids=batch["input_ids"])
    for handle in handles:
        handle.remove()
    return {name: (targets[name].weight.detach().clone(), accumulators[name].H) for name in targets}


def objective(W: Any, Q: Any, H: Any) -> float:
    """tr((W - Q) H (W - Q)^T) / 2 in float64: GPTQ's loss for the inputs that built H."""
    E = (W - Q).double()
    return float((E @ H.double() * E).sum()) / 2


def same_inputs(model_dir: Path, samples: int, seed: int, folder: Path) -> None:
    """Part 1: both sweeps on the very same weights, Hessians and scales."""
    import torch

    from llmc_trace.algorithms import QuantizationArgs, gptq

    layers = layer_hessians(model_dir, samples, seed)
    print(f"\nPart 1: {len(layers)} layers, Hessians from the unquantized model\n")
    print(
        "| bits | identical layers | weights differing (all / worst layer) "
        "| objective ours / theirs | sweep seconds ours | theirs |"
    )
    print("|---|---|---|---|---|---|")
    for bits in BITS:
        args = QuantizationArgs(num_bits=bits, group_size=GROUP_SIZE, actorder="static")
        inputs, ours, our_seconds = [], [], 0.0
        for name, (W, H) in layers.items():
            start = time.perf_counter()
            quantized = gptq(W, H, args).quantized
            our_seconds += time.perf_counter() - start
            ours.append(quantized.weight)
            # the scales ours fitted up front from W, as llm-compressor's observer fits them
            inputs.append(
                {
                    "name": name,
                    "W": W,
                    "H": H,
                    "scale": quantized.scale,
                    "zero_point": quantized.zero_point,
                    "bits": bits,
                    "group_size": GROUP_SIZE,
                }
            )
        sent, returned = folder / f"sweep_in_{bits}.pt", folder / f"sweep_out_{bits}.pt"
        torch.save(inputs, sent)
        command = [str(REFERENCE_PYTHON), str(SWEEP_SCRIPT), str(sent), str(returned)]
        child = subprocess.run(
            [*command, "--threads", str(THREADS)],
            capture_output=True,
            text=True,
            env=child_environment(),
        )
        if child.returncode != 0:
            why = (child.stderr or child.stdout).strip().splitlines() or [
                f"exit {child.returncode}"
            ]
            print(f"| {bits} | llm-compressor failed: {why[-1]} |")
            continue
        theirs = torch.load(returned)
        differing = [float((q != t["Q"]).float().mean()) for q, t in zip(ours, theirs)]
        sizes = [q.numel() for q in ours]
        overall = sum(d * n for d, n in zip(differing, sizes)) / sum(sizes)
        ours_loss = sum(objective(i["W"], q, i["H"]) for i, q in zip(inputs, ours))
        theirs_loss = sum(objective(i["W"], t["Q"], i["H"]) for i, t in zip(inputs, theirs))
        fallbacks = sum(t["rtn_fallback"] for t in theirs)
        note = f" ({fallbacks} fell back to RTN)" if fallbacks else ""
        print(
            f"| {bits} | {differing.count(0.0)} of {len(ours)}{note} "
            f"| {overall:.4%} / {max(differing):.4%} "
            f"| {ours_loss:.6g} / {theirs_loss:.6g} "
            f"| {our_seconds:.2f} | {sum(t['seconds'] for t in theirs):.2f} |",
            flush=True,
        )


def float_order(
    model_dir: Path, samples: int, seed: int, batch_sizes: list[int], folder: Path
) -> None:
    """Part 2: whole runs of both tools at several calibration batch sizes."""
    calib_rows = folder / "calib_rows.npy"
    save_calibration_rows(model_dir, samples, seed, calib_rows)
    print(f"\nPart 2: perplexity on eval.npy by calibration batch size ({samples} rows)\n")
    for bits in BITS:
        setting = Setting(f"{bits}-bit g{GROUP_SIZE}", "gptq", "rtn", bits, GROUP_SIZE)
        ours: list[float | None] = []
        theirs: list[float | None] = []
        for batch_size in batch_sizes:
            run = run_ours(model_dir, "gptq", setting, samples, seed, True, batch_size)
            ours.append(run.get("ppl"))
            run = run_theirs(model_dir, setting, calib_rows, folder / "weights.pt", batch_size)
            theirs.append(run.get("ppl"))
        print(f"\n| {setting.label} | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |")
        print("|---|" + "---|" * len(batch_sizes))
        for who, figures in (("ours", ours), ("llm-compressor", theirs)):
            cells = " | ".join("failed" if f is None else f"{f:.3f}" for f in figures)
            print(f"| {who} | {cells} |")
        for who, figures in (("ours", ours), ("llm-compressor", theirs)):
            done = [f for f in figures if f is not None]
            if done:
                print(
                    f"{who}: {min(done):.3f} to {max(done):.3f} "
                    f"(spread {max(done) - min(done):.3f}, mean {statistics.mean(done):.3f})"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128, help="calibration rows (128)")
    parser.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="for part 2"
    )
    parser.add_argument("--no-float-order", action="store_true", help="skip part 2")
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not REFERENCE_PYTHON.exists():
        sys.exit(f"needs llm-compressor in {REFERENCE_PYTHON}: bash benchmarks/reference_env.sh")
    import torch

    torch.set_num_threads(THREADS)
    model_dir = args.model_dir.resolve()
    print(f"refmodel {model_dir}; {args.samples} x {SEQ_LEN} tokens (seed {args.seed})")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gptq_agreement_") as name:
        same_inputs(model_dir, args.samples, args.seed, Path(name))
        if not args.no_float_order:
            float_order(model_dir, args.samples, args.seed, args.batch_sizes, Path(name))
    print(
        f"\nload average (1 min) at end: {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - start:.0f} s in all"
    )


if __name__ == "__main__":
    main()
