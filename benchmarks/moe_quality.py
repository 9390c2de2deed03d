"""GPTQ against round-to-nearest on the repository's trained mixture-of-experts model.

``refmodel/moe/`` (``refmodel.MOE_FOLDER``) is the reference model's recipe applied to a
Qwen3-MoE: its experts are what this measures. Each setting compresses it in memory from
``--samples`` rows of its ``calib.npy`` (``--seq-len`` tokens) and evaluates perplexity on
``--eval-rows`` rows of ``eval.npy``, the float model measured in the same run. Besides the
perplexities it prints how many expert projections each run compressed, of how many the model
has, and how many were rounded to nearest instead (only with ``--expert-tokens routed``: by
default every expert's Hessian sees every token). Perplexities are deterministic, so each
setting runs once.

The run writes ``benchmarks/results/moe_quality.json`` (``_results.Run``): every perplexity and
count, and the settings; ``tables`` renders the table printed here, and the README's, from that
file alone.

    python benchmarks/moe_quality.py                      # W4A16, 3-bit and 2-bit, GPTQ and RTN
    python benchmarks/moe_quality.py --expert-tokens routed
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import refmodel
from llmc_trace.algorithms.scheme import W4A16
from llmc_trace.evaluate.perplexity import perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import CompressRequest, compress

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import Run  # noqa: E402

SCHEMES = {
    "W4A16 (group 128)": W4A16,
    "3-bit (group 128)": W4A16.with_weights(num_bits=3),
    "2-bit (group 64)": W4A16.with_weights(num_bits=2, group_size=64),
}
THREADS = 2
METHODS = ("gptq", "rtn")


def expert_projections(model: torch.nn.Module) -> int:
    """The expert projections a model holds: transformers 5 fuses each layer's experts into
    ``experts.gate_up_proj`` (two projections per expert) and ``experts.down_proj`` (one)."""
    count = 0
    for name, parameter in model.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            count += 2 * parameter.shape[0]
        elif name.endswith("experts.down_proj"):
            count += parameter.shape[0]
    return count


def measured(folder: Path, args: argparse.Namespace, scheme: Any, method: str, rows: Any) -> dict:
    """One in-memory compression: its perplexity on ``rows`` and its expert projections,
    compressed and rounded to nearest instead."""
    start = time.perf_counter()
    run = compress(
        CompressRequest(
            folder,
            dataset=refmodel.FOLDER / "calib.npy",
            samples=args.samples,
            seq_len=args.seq_len,
            method=method,
            scheme=scheme,
            expert_tokens=args.expert_tokens,
        )
    )
    seconds = time.perf_counter() - start
    ppl = perplexity(run.model.float(), rows).perplexity
    experts = [layer for layer in run.layers if ".experts." in layer.name]
    fallen = [layer for layer in experts if layer.fallback]
    print(f"  {method}: ppl {ppl:.3f} ({seconds:.0f} s)", flush=True)
    return {"perplexity": ppl, "experts_compressed": len(experts), "rounded_instead": len(fallen)}


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The markdown table, from the result file alone: per setting both perplexities, GPTQ's
    gain, the share of RTN's loss over the float model it wins back, and GPTQ's expert
    projections (compressed, of the model's, and those rounded to nearest instead)."""
    figures = result["figures"]
    base, total = figures["float_perplexity"], figures["expert_projections"]
    lines = [
        "| setting | GPTQ | RTN | GPTQ gain | of RTN's loss won back "
        "| expert projections compressed | rounded instead |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in figures["schemes"]:
        gptq, rtn = row["gptq"], row["rtn"]
        gain = rtn["perplexity"] - gptq["perplexity"]
        won = f"{gain / (rtn['perplexity'] - base):.0%}".replace("%", " %")
        lines.append(
            f"| {row['setting']} | {gptq['perplexity']:.3f} | {rtn['perplexity']:.3f} "
            f"| {gain:.3f} | {won} | {gptq['experts_compressed']} of {total} "
            f"| {gptq['rounded_instead']} |"
        )
    return {"quality": "\n".join(lines)}


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: the harshest setting, GPTQ against RTN."""
    figures = result["figures"]
    row = figures["schemes"][-1]
    return [(
        f"MoE {row['setting']}: GPTQ vs RTN, every expert calibrated",
        f"perplexity {row['gptq']['perplexity']:.3f} vs {row['rtn']['perplexity']:.3f} "
        f"(float {figures['float_perplexity']:.3f}); {row['gptq']['experts_compressed']} of "
        f"{figures['expert_projections']} expert projections",
    )]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--expert-tokens", choices=("all", "routed"), default="all")
    parser.add_argument("--schemes", nargs="*", choices=sorted(SCHEMES), default=sorted(SCHEMES))
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    result = Run("moe_quality")
    folder = refmodel.MOE_FOLDER
    rows = np.load(refmodel.FOLDER / "eval.npy")[: args.eval_rows]  # the Llama's rows, shared
    float_model = load_pretrained(resolve_model(str(folder)), "sdpa", torch.bfloat16).float()
    base = perplexity(float_model, rows).perplexity
    total = expert_projections(float_model)
    del float_model
    print(f"refmodel/moe, {args.samples} x {args.seq_len} calibration, {len(rows)} eval rows")
    print(f"float (bf16 weights): {base:.3f}; {total} expert projections", flush=True)
    schemes = []
    for label, scheme in SCHEMES.items():
        if label not in args.schemes:
            continue
        print(label, flush=True)
        runs = {method: measured(folder, args, scheme, method, rows) for method in METHODS}
        schemes.append({"setting": label, **runs})
    figures = {
        "model": "refmodel/moe",
        "samples": args.samples,
        "seq_len": args.seq_len,
        "eval_rows": len(rows),
        "expert_tokens": args.expert_tokens,
        "threads": THREADS,
        "float_perplexity": base,
        "expert_projections": total,
        "schemes": schemes,
    }
    print()
    print(tables({"figures": figures})["quality"])
    result.write(figures)


if __name__ == "__main__":
    main()
