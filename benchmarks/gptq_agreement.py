"""Check that llmc-trace's GPTQ and llm-compressor's agree, and how far float order moves both.

Two parts, on the repository's trained reference model (``refmodel/``), for 3-bit and 4-bit group-128
symmetric GPTQ with static activation order (llm-compressor's W4A16 preset at each width):

1. Same inputs, same answer. Every targeted layer's Hessian is accumulated once from the
   unquantized model on ``--samples`` calibration rows; then each layer's weight, Hessian and
   group scales go to llmc-trace's ``gptq`` and to llm-compressor's ``quantize_weight`` (in
   ``benchmarks/.venv-llmc``, through ``_reference/gptq_sweep_llmcompressor.py``). Measured: how
   many layers come out bit-identical, the fraction of weights that differ, the GPTQ objective
   ``tr((W - Q) H (W - Q)^T) / 2`` of each (float64), and the seconds of the sweeps alone, each
   tool's sweeps run ``--repeat`` times (which must return the same weights every time).
2. Float order alone. Whole runs of both tools (``compress`` and ``oneshot``, with error
   propagation through the quantized layers, as ``compress_quality.py`` runs them) on the same
   rows at calibration batch sizes ``--batch-sizes``: batching changes no value that reaches
   GPTQ, only the order of floating-point sums, so the perplexities are the spread of each
   tool's result under rounding noise alone.

The run writes ``benchmarks/results/gptq_agreement.json`` (``_results.Run``; ``--result`` names
another path): per width, the agreement counts, both objectives, every differing layer, the
sweeps' seconds as a spread over the repeats, and each batch size's perplexity for both tools,
with what each tool's measuring processes ran with. ``tables(result)`` renders the tables from
that file alone (``benchmarks/tables.py``); the tables printed at the end are its output.

    python benchmarks/gptq_agreement.py                    # both parts, ~15-20 min on 2 cores
    python benchmarks/gptq_agreement.py --no-float-order   # part 1 only, ~2 min
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, spread, spread_text  # noqa: E402
from compress_quality import (  # noqa: E402
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
    without_environment,
)

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


def our_sweeps(
    layers: dict[str, Any], bits: int, repeat: int
) -> tuple[list[Any], list[dict[str, Any]], list[float], bool]:
    """Our GPTQ on every layer, ``repeat`` times: the first pass's quantized weights, the
    inputs for llm-compressor (with the scales ours fitted up front from W, as its observer
    fits them), each pass's seconds, and whether every pass returned the same weights."""
    import torch

    from llmc_trace.algorithms import QuantizationArgs, gptq

    args = QuantizationArgs(num_bits=bits, group_size=GROUP_SIZE, actorder="static")
    first: list[Any] = []
    inputs: list[dict[str, Any]] = []
    seconds: list[float] = []
    same = True
    for index in range(repeat):
        elapsed = 0.0
        for position, (name, (W, H)) in enumerate(layers.items()):
            start = time.perf_counter()
            quantized = gptq(W, H, args).quantized
            elapsed += time.perf_counter() - start
            if index:
                same = same and torch.equal(quantized.weight, first[position])
                continue
            first.append(quantized.weight)
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
        seconds.append(elapsed)
    return first, inputs, seconds, same


def their_sweeps(
    inputs: list[dict[str, Any]], bits: int, repeat: int, folder: Path
) -> dict[str, Any]:
    """llm-compressor's ``quantize_weight`` on the same inputs, ``repeat`` fresh processes: the
    first run's layers, each run's seconds, whether every run agreed, its environment; or
    ``error``."""
    import torch

    sent, returned = folder / f"sweep_in_{bits}.pt", folder / f"sweep_out_{bits}.pt"
    torch.save(inputs, sent)
    command = [str(REFERENCE_PYTHON), str(SWEEP_SCRIPT), str(sent), str(returned)]
    first: list[dict[str, Any]] = []
    seconds: list[float] = []
    same, environment = True, None
    for index in range(repeat):
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
            return {"error": why[-1]}
        layers = torch.load(returned)
        reported = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
        if reported:
            environment = json.loads(reported[-1].removeprefix("RESULT "))["environment"]
        seconds.append(sum(t["seconds"] for t in layers))
        if index:
            same = same and all(torch.equal(a["Q"], b["Q"]) for a, b in zip(first, layers))
        else:
            first = layers
    return {"layers": first, "seconds": seconds, "same": same, "environment": environment}


def agreement(
    bits: int,
    inputs: list[dict[str, Any]],
    ours: list[Any],
    theirs: list[dict[str, Any]],
) -> dict[str, Any]:
    """How far the two tools' weights and objectives differ, in all and per layer."""
    per_layer = []
    for given, q, t in zip(inputs, ours, theirs):
        per_layer.append(
            {
                "name": given["name"],
                "weights": q.numel(),
                "differing": int((q != t["Q"]).sum()),
                "objective_ours": objective(given["W"], q, given["H"]),
                "objective_theirs": objective(given["W"], t["Q"], given["H"]),
                "theirs_rtn_fallback": t["rtn_fallback"],
            }
        )
    weights = sum(layer["weights"] for layer in per_layer)
    return {
        "bits": bits,
        "group_size": GROUP_SIZE,
        "layers": len(per_layer),
        "identical_layers": sum(layer["differing"] == 0 for layer in per_layer),
        "rtn_fallbacks": sum(layer["theirs_rtn_fallback"] for layer in per_layer),
        "weights": weights,
        "differing_weights": sum(layer["differing"] for layer in per_layer),
        "worst_layer_fraction": max(layer["differing"] / layer["weights"] for layer in per_layer),
        "objective_ours": sum(layer["objective_ours"] for layer in per_layer),
        "objective_theirs": sum(layer["objective_theirs"] for layer in per_layer),
        "per_layer": per_layer,
    }


def same_inputs(
    model_dir: Path,
    samples: int,
    seed: int,
    repeat: int,
    folder: Path,
    environments: dict[str, Any],
) -> list[dict[str, Any]]:
    """Part 1: both sweeps on the very same weights, Hessians and scales, per width."""
    layers = layer_hessians(model_dir, samples, seed)
    print(f"\nPart 1: {len(layers)} layers, Hessians from the unquantized model", flush=True)
    results = []
    for bits in BITS:
        ours, inputs, our_seconds, ours_same = our_sweeps(layers, bits, repeat)
        theirs = their_sweeps(inputs, bits, repeat, folder)
        if "error" in theirs:
            print(f"  {bits} bits: llm-compressor failed: {theirs['error']}", flush=True)
            results.append({"bits": bits, "group_size": GROUP_SIZE, "error": theirs["error"]})
            continue
        environments.setdefault("llm-compressor sweep", theirs["environment"])
        result = agreement(bits, inputs, ours, theirs["layers"])
        result.update(
            {
                "ours_seconds": spread(our_seconds),
                "theirs_seconds": spread(theirs["seconds"]),
                "ours_repeats_identical": ours_same,
                "theirs_repeats_identical": theirs["same"],
            }
        )
        print(
            f"  {bits} bits: {result['identical_layers']} of {result['layers']} layers "
            f"identical, objective {result['objective_ours']:.6g} / "
            f"{result['objective_theirs']:.6g}",
            flush=True,
        )
        results.append(result)
    return results


def float_order(
    model_dir: Path,
    samples: int,
    seed: int,
    batch_sizes: list[int],
    folder: Path,
    environments: dict[str, Any],
) -> list[dict[str, Any]]:
    """Part 2: whole runs of both tools at several calibration batch sizes, per width."""
    calib_rows = folder / "calib_rows.npy"
    save_calibration_rows(model_dir, samples, seed, calib_rows)
    print(f"\nPart 2: perplexity on eval.npy by calibration batch size ({samples} rows)")
    results = []
    for bits in BITS:
        setting = Setting(f"{bits}-bit g{GROUP_SIZE}", "gptq", "rtn", bits, GROUP_SIZE)
        ours: list[float | None] = []
        theirs: list[float | None] = []
        for batch_size in batch_sizes:
            run = run_ours(model_dir, "gptq", setting, samples, seed, True, batch_size)
            ours.append(without_environment(run, environments, "llmc-trace worker").get("ppl"))
            run = run_theirs(model_dir, setting, calib_rows, folder / "weights.pt", batch_size)
            run = without_environment(run, environments, "llm-compressor worker")
            theirs.append(run.get("ppl"))
        results.append(
            {
                "bits": bits,
                "group_size": GROUP_SIZE,
                "batch_sizes": batch_sizes,
                "ours": ours,
                "theirs": theirs,
            }
        )
    return results


# ---- the tables, from the result file alone -------------------------------------------------


def same_inputs_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| bits | identical layers | weights differing (all / worst layer) "
        "| objective ours / theirs | sweep seconds ours | theirs |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['bits']} | llm-compressor failed: {row['error']} | | | | |")
            continue
        note = f" ({row['rtn_fallbacks']} fell back to RTN)" if row["rtn_fallbacks"] else ""
        overall = row["differing_weights"] / row["weights"]
        lines.append(
            f"| {row['bits']} | {row['identical_layers']} of {row['layers']}{note} "
            f"| {overall:.4%} / {row['worst_layer_fraction']:.4%} "
            f"| {row['objective_ours']:.6g} / {row['objective_theirs']:.6g} "
            f"| {spread_text(row['ours_seconds'], '.2f')} "
            f"| {spread_text(row['theirs_seconds'], '.2f')} |"
        )
    return "\n".join(lines)


def float_order_table(rows: list[dict[str, Any]]) -> str:
    batch_sizes = rows[0]["batch_sizes"]
    lines = [
        "| setting | tool | " + " | ".join(f"batch {b}" for b in batch_sizes) + " | range |",
        "|---|---|" + "---|" * (len(batch_sizes) + 1),
    ]
    for row in rows:
        for who, figures in (("ours", row["ours"]), ("llm-compressor", row["theirs"])):
            cells = " | ".join("failed" if f is None else f"{f:.3f}" for f in figures)
            done = [f for f in figures if f is not None]
            extent = f"{min(done):.3f}-{max(done):.3f}" if done else "-"
            lines.append(
                f"| {row['bits']}-bit g{row['group_size']} | {who} | {cells} | {extent} |"
            )
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``same_inputs`` (part 1: one row per width) and, when part 2 ran, ``float_order``
    (each tool's perplexity by calibration batch size)."""
    figures = result["figures"]
    rendered = {"same_inputs": same_inputs_table(figures["same_inputs"])}
    if figures.get("float_order"):
        rendered["float_order"] = float_order_table(figures["float_order"])
    return rendered


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row per width: each tool's perplexity range over batch sizes."""
    rows = []
    for row in result["figures"].get("float_order") or []:
        ours = [f for f in row["ours"] if f is not None]
        theirs = [f for f in row["theirs"] if f is not None]
        rows.append((
            f"GPTQ {row['bits']}-bit g{row['group_size']} on the reference model beside "
            "llm-compressor 0.14",
            f"perplexity {min(ours):.3f}-{max(ours):.3f} vs {min(theirs):.3f}-{max(theirs):.3f} "
            f"over batch sizes {', '.join(map(str, row['batch_sizes']))}",
        ))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128, help="calibration rows (128)")
    parser.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="for part 2"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed sweeps per tool in part 1 (default 3)"
    )
    parser.add_argument("--no-float-order", action="store_true", help="skip part 2")
    parser.add_argument(
        "--result", type=Path, help="where the result goes (default benchmarks/results/"
        "gptq_agreement.json)",
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not REFERENCE_PYTHON.exists():
        sys.exit(f"needs llm-compressor in {REFERENCE_PYTHON}: bash benchmarks/reference_env.sh")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    run = Run("gptq_agreement")
    import torch

    torch.set_num_threads(THREADS)
    model_dir = args.model_dir.resolve()
    print(f"refmodel {model_dir}; {args.samples} x {SEQ_LEN} tokens (seed {args.seed})")
    print(f"load average at start: {run.load_before}")
    environments: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gptq_agreement_") as name:
        agreeing = same_inputs(
            model_dir, args.samples, args.seed, args.repeat, Path(name), environments
        )
        spreads = []
        if not args.no_float_order:
            spreads = float_order(
                model_dir, args.samples, args.seed, args.batch_sizes, Path(name), environments
            )
    figures = {
        "model": "refmodel",
        "samples": args.samples,
        "seq_len": SEQ_LEN,
        "seed": args.seed,
        "threads": THREADS,
        "repeat": args.repeat,
        "group_size": GROUP_SIZE,
        "actorder": "static",
        "same_inputs": agreeing,
        "float_order": spreads,
    }
    path = run.write(figures, environments=environments, path=args.result)
    document = json.loads(path.read_text())
    for table in tables(document).values():
        print()
        print(table)
    print(f"\nload average at end: {document['load_average']['after']}; {document['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
