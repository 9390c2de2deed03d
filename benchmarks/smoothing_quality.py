"""AWQ and SmoothQuant against the methods they are paired with, on the reference model.

The reference model (``refmodel/``) is compressed in memory from ``--samples`` rows of its
``calib.npy`` (``--seq-len`` tokens), drawn with ``--repeat`` different seeds, and evaluated on
``--eval-rows`` rows of ``eval.npy``; the float model is measured in the same run. Weight-only
settings: round-to-nearest (data-free, so one run), GPTQ and AWQ at W4A16. W8A8:
GPTQ alone and a SmoothQuant stage before it (``smoothing_strength`` 0.5), evaluated with the
activations quantized as an engine serving W8A8 quantizes them (int8, one symmetric scale per
token, at run time: a forward pre-hook on every quantized layer), since the weights alone are
not what SmoothQuant changes. A figure is the median of the seeds with its range. The
defaults (64 rows of 512 tokens, all 128 evaluation rows) keep the seeds' spread well below the
differences measured: from 8 rows it was as wide as AWQ's gain over round-to-nearest.

The run writes ``benchmarks/results/smoothing_quality.json`` (``_results.Run``); ``tables``
renders the docs' table from it alone (``benchmarks/tables.py``).

    python benchmarks/smoothing_quality.py --repeat 3        # every row, ~12 min
    python benchmarks/smoothing_quality.py --repeat 1 --samples 8 --eval-rows 16   # quick
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
from llmc_trace.algorithms.scheme import W4A16, W8A8
from llmc_trace.evaluate.perplexity import perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.spec.stage import Stage

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import Run, goal, spread, spread_text  # noqa: E402

THREADS = 2
#: (setting, scheme, methods); a method is a stage list's methods, the last one quantizing
SETTINGS = (
    ("W4A16 (group 128)", W4A16, ("rtn", "gptq", "awq")),
    ("W8A8", W8A8, ("gptq", "smoothquant+gptq")),
)
DATA_FREE = {"rtn"}


def activations_quantized(model: torch.nn.Module, layers: list[str]) -> list[Any]:
    """Quantize the inputs of ``layers`` to int8 per token, as an engine serving W8A8 does
    (dynamic, symmetric); the hooks' handles, to remove them."""

    def hook(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        # compressed-tensors' symmetric scale: the range over (qmax - qmin) / 2
        scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.5
        return ((x / scale).round().clamp(-128, 127) * scale, *args[1:])

    return [model.get_submodule(name).register_forward_pre_hook(hook) for name in layers]


def measured(args: argparse.Namespace, scheme: Any, method: str, seed: int, rows: Any) -> dict:
    """One in-memory compression and its perplexity on ``rows``."""
    stages = [
        Stage(method=m, scheme=scheme if m != "smoothquant" else "auto") for m in method.split("+")
    ]
    start = time.perf_counter()
    run = compress(
        CompressRequest(
            str(refmodel.FOLDER),
            dataset=refmodel.FOLDER / "calib.npy",
            samples=args.samples,
            seq_len=args.seq_len,
            seed=seed,
            stages=stages,
        )
    )
    seconds = time.perf_counter() - start
    model = run.model.float()
    handles = []
    if scheme.input_activations is not None:
        handles = activations_quantized(model, [layer.name for layer in run.layers])
    ppl = perplexity(model, rows).perplexity
    for handle in handles:
        handle.remove()
    print(f"  {method} seed {seed}: ppl {ppl:.3f} ({seconds:.0f} s)", flush=True)
    return {"perplexity": ppl, "seconds": seconds}


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The docs' table from the result file alone: per setting and method the perplexity
    (median of the seeds, with their range) and the compress seconds."""
    figures = result["figures"]
    lines = [
        f"float (bf16 weights): {figures['float_perplexity']:.3f}",
        "",
        "| setting | method | perplexity | seconds |",
        "|---|---|---|---|",
    ]
    for row in figures["rows"]:
        lines.append(
            f"| {row['setting']} | {row['method']} | {spread_text(row['perplexity'], '.3f')} "
            f"| {spread_text(row['seconds'], '.0f')} |"
        )
    return {"quality": "\n".join(lines)}


def _goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """AWQ beats RTN by more than its own spread at W4A16; SmoothQuant + GPTQ at least
    matches GPTQ at W8A8: its median is better, or worse by no more than the seeds move either
    method (the wider of the two ranges), since a difference inside that is the calibration
    draw's, not the method's."""
    by = {(r["setting"], r["method"]): r["perplexity"] for r in rows}
    found = []
    awq, rtn = by.get(("W4A16 (group 128)", "awq")), by.get(("W4A16 (group 128)", "rtn"))
    if awq and rtn:
        width = awq["max"] - awq["min"]
        found.append(goal(
            "AWQ W4A16 beats RTN W4A16 by more than its spread",
            "rtn - awq > awq's range",
            f"{rtn['median'] - awq['median']:.3f} vs range {width:.3f}",
            rtn["median"] - awq["median"] > width,
        ))  # fmt: skip
    sq, gptq = by.get(("W8A8", "smoothquant+gptq")), by.get(("W8A8", "gptq"))
    if sq and gptq:
        noise = max(sq["max"] - sq["min"], gptq["max"] - gptq["min"])
        found.append(goal(
            "SmoothQuant + GPTQ W8A8 at least matches GPTQ W8A8",
            "median - GPTQ's median <= the wider seed range",
            f"{sq['median'] - gptq['median']:+.4f} vs range {noise:.4f}",
            sq["median"] - gptq["median"] <= noise,
        ))  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-rows", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    result = Run("smoothing_quality")
    rows = np.load(refmodel.FOLDER / "eval.npy")[: args.eval_rows]
    source = resolve_model(str(refmodel.FOLDER))
    base = perplexity(load_pretrained(source, "sdpa", torch.bfloat16).float(), rows).perplexity
    print(f"refmodel, {args.samples} x {args.seq_len} calibration, {len(rows)} eval rows")
    print(f"float (bf16 weights): {base:.3f}", flush=True)
    table = []
    for setting, scheme, methods in SETTINGS:
        print(setting, flush=True)
        for method in methods:
            seeds = [0] if method in DATA_FREE else list(range(args.repeat))
            runs = [measured(args, scheme, method, seed, rows) for seed in seeds]
            table.append({
                "setting": setting,
                "method": method,
                "perplexity": spread([r["perplexity"] for r in runs]),
                "seconds": spread([r["seconds"] for r in runs], digits=1),
            })  # fmt: skip
    figures = {
        "model": "refmodel",
        "samples": args.samples,
        "seq_len": args.seq_len,
        "eval_rows": len(rows),
        "seeds": args.repeat,
        "threads": THREADS,
        "float_perplexity": base,
        "rows": table,
    }
    print()
    print(tables({"figures": figures})["quality"])
    result.write(
        figures,
        goals=_goals(table),
        notes=[
            "W8A8 rows are evaluated with the activations quantized to int8 per token at run "
            "time, as an engine serving the checkpoint does.",
            "Round-to-nearest needs no data: one run.",
        ],
    )


if __name__ == "__main__":
    main()
