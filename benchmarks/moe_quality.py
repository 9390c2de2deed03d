"""GPTQ against round-to-nearest on the repository's trained mixture-of-experts model.

``refmodel/moe/`` (``refmodel.MOE_FOLDER``) is the reference model's recipe applied to a
Qwen3-MoE: its experts are what this measures. Each setting compresses it in memory from
``--samples`` rows of its ``calib.npy`` (``--seq-len`` tokens) and evaluates perplexity on
``--eval-rows`` rows of ``eval.npy``, the float model measured in the same run. Besides the
perplexities it prints how many expert projections each run compressed and how many fell back
to round-to-nearest (only with ``--expert-tokens routed``: by default every expert's Hessian
sees every token).

    python benchmarks/moe_quality.py                      # W4A16, 3-bit and 2-bit, GPTQ and RTN
    python benchmarks/moe_quality.py --expert-tokens routed
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import refmodel
from llmc_trace.algorithms.scheme import W4A16
from llmc_trace.evaluate.perplexity import perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import CompressRequest, compress

SCHEMES = {
    "W4A16 (group 128)": W4A16,
    "3-bit (group 128)": W4A16.with_weights(num_bits=3),
    "2-bit (group 64)": W4A16.with_weights(num_bits=2, group_size=64),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--expert-tokens", choices=("all", "routed"), default="all")
    parser.add_argument("--schemes", nargs="*", choices=sorted(SCHEMES), default=sorted(SCHEMES))
    args = parser.parse_args()
    torch.set_num_threads(2)
    folder = refmodel.MOE_FOLDER
    rows = np.load(refmodel.FOLDER / "eval.npy")[: args.eval_rows]  # the Llama's rows, shared
    float_model = load_pretrained(resolve_model(str(folder)), "sdpa", torch.bfloat16).float()
    base = perplexity(float_model, rows).perplexity
    del float_model
    print(f"refmodel/moe, {args.samples} x {args.seq_len} calibration, {len(rows)} eval rows")
    print(f"float (bf16 weights): {base:.3f}")
    print("| setting | GPTQ | RTN | GPTQ gain | experts compressed | fell back | GPTQ s |")
    print("|---|---|---|---|---|---|---|")
    for label, scheme in SCHEMES.items():
        if label not in args.schemes:
            continue
        results = {}
        for method in ("gptq", "rtn"):
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
            results[method] = (ppl, seconds, len(experts), len(fallen))
        gptq, rtn = results["gptq"], results["rtn"]
        print(
            f"| {label} | {gptq[0]:.3f} | {rtn[0]:.3f} | {rtn[0] - gptq[0]:.3f} "
            f"| {gptq[2]} | {gptq[3]} | {gptq[1]:.0f} |"
        )


if __name__ == "__main__":
    main()
