"""Perplexity of the reference model per compressed-tensors preset: GPTQ beside round-to-nearest.

For each preset (FP8 per channel and per 128x128 block, NVFP4, and the integer W4A16 beside
them; ``--presets`` names others), ``compress`` (the Python API, as ``llmc-trace compress``
runs it) quantizes ``refmodel/`` with round-to-nearest and with GPTQ; GPTQ is repeated over
``--repeat`` calibration draws (seeds 0, 1, ...: which rows of ``calib.npy`` it calibrates
on), since its result depends on them, while round-to-nearest uses no data and runs once. Each
model is scored on the same rows of ``refmodel/eval.npy`` (all, or the first ``--eval-rows``)
in float32 with its weights as quantized (weights only: activation rounding, which the serving
check in ``benchmarks/scheme_presets.py`` includes, is left out here so that the two methods'
weights alone are compared). The float model is scored the same way.

Beside them, llm-compressor's GPTQ with the same preset (``GPTQModifier(scheme=PRESET)``, in
``benchmarks/.venv-llmc``: ``benchmarks/_reference/gptq_llmcompressor.py``) on the very rows
our first draw calibrated on, its weights scored the same way (``compress_quality.py``'s
``measure_weights``); one draw, for the presets ``--llm-compressor`` names (default: all),
where it runs (its venv exists and its oneshot succeeds).

The goals: every preset's GPTQ perplexity (its worst draw) within ``MARGINS`` of the float
model's (relative), and GPTQ at least as good as round-to-nearest: its median draw no higher
than round-to-nearest's plus the noise, the larger of GPTQ's spread over draws and ``NOISE``
(relative; 8-bit float grids lose so little that the two methods differ by less than that,
and an ordering float noise could flip is not judged).

The figures are written to ``benchmarks/results/scheme_quality.json`` (``--result`` names
another file); ``tables(result)`` renders the docs' table.

    flock /tmp/llmc-bench.lock python benchmarks/scheme_quality.py --repeat 3 --samples 16 --eval-rows 64
    python benchmarks/scheme_quality.py --presets FP8_DYNAMIC --repeat 1 --samples 16
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal, spread, spread_text  # noqa: E402

ROOT = HERE.parent
REFMODEL = ROOT / "refmodel"
SEQ_LEN = 512
EVAL_BATCH_SIZE = 8
PRESETS = ("FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "W4A16")
#: Relative perplexity increase over the float model each preset's GPTQ must stay within: what
#: the docs report as the preset's margin on this model (8-bit grids lose almost nothing, the
#: 4-bit ones a few per cent).
MARGINS = {
    "FP8_DYNAMIC": 0.005,
    "FP8_BLOCK": 0.005,
    "NVFP4A16": 0.03,
    "W4A16": 0.03,
}
#: The smallest perplexity difference judged (relative): the tolerance at which vLLM's and
#: llmc-trace's perplexities of one checkpoint are taken to agree (``vllm_serving.py``).
NOISE = 1e-3


def score(model: Any, tokens: np.ndarray) -> float:
    from llmc_trace.evaluate import perplexity

    return perplexity(model.float(), tokens, batch_size=EVAL_BATCH_SIZE).perplexity


def compressed_perplexity(
    preset: str, method: str, samples: int, seed: int, tokens: np.ndarray
) -> tuple[float, float]:
    """One ``compress`` in memory and its model's perplexity; and its seconds."""
    from llmc_trace.oneshot import CompressRequest, compress

    start = time.perf_counter()
    request = CompressRequest(
        REFMODEL,
        dataset=REFMODEL / "calib.npy",
        samples=samples,
        seq_len=SEQ_LEN,
        seed=seed,
        method=method,
        scheme=preset,
    )
    model = compress(request).model
    seconds = time.perf_counter() - start
    return score(model, tokens), seconds


def llm_compressor_perplexity(
    preset: str, samples: int, eval_rows: int | None, scratch: Path
) -> dict[str, Any]:
    """llm-compressor's GPTQ with ``preset`` on the rows of our draw 0, its weights scored on
    the first ``eval_rows`` evaluation rows (all: None), as ours are; ``{"error": ...}``
    where it does not run."""
    from compress_quality import (
        REFERENCE_PYTHON,
        REFERENCE_SCRIPT,
        measure_weights,
        run_child,
        save_calibration_rows,
    )

    if not REFERENCE_PYTHON.exists():
        return {"error": f"no {REFERENCE_PYTHON.relative_to(ROOT)} (benchmarks/reference_env.sh)"}
    rows, save = scratch / "calib_rows.npy", scratch / f"{preset}.pt"
    save_calibration_rows(REFMODEL, samples, 0, rows)
    command = [str(REFERENCE_PYTHON), str(REFERENCE_SCRIPT), str(REFMODEL), str(rows)]
    command += ["--scheme", preset, "--threads", "2", "--save", str(save)]
    result = run_child(command, f"{preset} llm-compressor")
    if "error" in result:
        return {"error": str(result["error"]).strip().splitlines()[-1][:300]}
    spec = {"model_dir": str(REFMODEL), "weights": str(save), "eval_rows": eval_rows}
    measured = measure_weights(spec)
    available = len(np.load(REFMODEL / "eval.npy", mmap_mode="r"))
    return {
        "ppl": measured["ppl"],
        "evaluation_rows": min(eval_rows or available, available),
        "oneshot_s": round(result["oneshot_s"], 1),
    }


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``quality``: one row per preset, perplexity of RTN and GPTQ (median, min-max)."""
    figures = result["figures"]
    lines = [
        f"Float model: perplexity {figures['float']:.3f}.",
        "",
        "| preset | RTN | GPTQ (median, min-max over draws) | GPTQ's worst vs float | margin "
        "| llm-compressor GPTQ (draw 0) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in figures["rows"]:
        gptq, theirs = row["gptq"], row.get("llm_compressor", {})
        theirs_text = f"{theirs['ppl']:.3f}" if "ppl" in theirs else theirs.get("error", "-")
        if "ppl" in theirs and theirs.get("evaluation_rows") != figures["evaluation_rows"]:
            theirs_text += f" (on {theirs.get('evaluation_rows', 'all')} rows)"
        lines.append(
            f"| {row['preset']} | {row['rtn']:.3f} | {spread_text(gptq, '.3f')} "
            f"| {100 * (gptq['max'] / figures['float'] - 1):+.2f} % "
            f"| {100 * MARGINS.get(row['preset'], float('nan')):.1f} % "
            f"| {theirs_text.replace('|', '/')} |"
        )
    return {"quality": "\n".join(lines)}


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--repeat", type=int, default=3, help="GPTQ calibration draws")
    parser.add_argument("--samples", type=int, default=32, help="calibration rows per draw")
    parser.add_argument("--eval-rows", type=int, help="evaluation rows scored (default: all)")
    parser.add_argument(
        "--llm-compressor", nargs="*", help="presets llm-compressor runs (default: all)"
    )
    parser.add_argument(
        "--result", type=Path, help="default: benchmarks/results/scheme_quality.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    record = Run("scheme_quality")
    tokens = np.load(REFMODEL / "eval.npy")[: args.eval_rows]
    original = AutoModelForCausalLM.from_pretrained(REFMODEL, dtype=torch.float32).eval()
    float_ppl = score(original, tokens)
    print(f"float {float_ppl:.3f}", flush=True)
    rows = []
    for preset in args.presets:
        rtn_ppl, rtn_s = compressed_perplexity(preset, "rtn", args.samples, 0, tokens)
        runs = [
            compressed_perplexity(preset, "gptq", args.samples, seed, tokens)
            for seed in range(args.repeat)
        ]
        theirs: dict[str, Any] = {"error": "not run"}
        if args.llm_compressor is None or preset in args.llm_compressor:
            with tempfile.TemporaryDirectory() as scratch:
                theirs = llm_compressor_perplexity(
                    preset, args.samples, args.eval_rows, Path(scratch)
                )
        row = {
            "preset": preset,
            "rtn": rtn_ppl,
            "gptq": spread([ppl for ppl, _ in runs]),
            "llm_compressor": theirs,
            "rtn_s": round(rtn_s, 1),
            "gptq_s": spread([seconds for _, seconds in runs], 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    goals = []
    for row in rows:
        gptq, margin = row["gptq"], MARGINS.get(row["preset"])
        if margin is not None:
            goals.append(goal(
                f"{row['preset']} GPTQ within its margin of the float model",
                f"perplexity <= float x {1 + margin}",
                f"{gptq['max']:.3f} vs {float_ppl * (1 + margin):.3f}",
                gptq["max"] <= float_ppl * (1 + margin),
            ))  # fmt: skip
        noise = max(gptq["max"] - gptq["min"], NOISE * float_ppl)
        goals.append(goal(
            f"{row['preset']} GPTQ at least as good as RTN",
            "GPTQ's median <= RTN + noise (GPTQ's spread, at least 0.1 %)",
            f"{gptq['median']:.3f} vs {row['rtn']:.3f} + {noise:.3f}",
            gptq["median"] <= row["rtn"] + noise,
        ))  # fmt: skip
    path = record.write(
        {
            "float": float_ppl,
            "samples": args.samples,
            "repeat": args.repeat,
            "seq_len": SEQ_LEN,
            "evaluation_rows": int(tokens.shape[0]),
            "margins": MARGINS,
            "rows": rows,
        },
        goals=goals,
        notes=[
            "Weights only: activations are left in float here (see scheme_presets for the "
            "checkpoints served with their activations quantized).",
            f"GPTQ over {args.repeat} calibration draws of {args.samples} rows; RTN uses no data.",
        ],
        path=args.result,
    )
    print(tables(json.loads(path.read_text()))["quality"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
