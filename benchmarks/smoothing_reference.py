"""llmc-trace's AWQ and SmoothQuant + GPTQ beside llm-compressor's, same model, rows and evaluator.

The reference model (``refmodel/``) is compressed from the very calibration rows by both tools:
AWQ W4A16, and SmoothQuant (strength 0.5) then GPTQ W8A8. llm-compressor runs in
``benchmarks/.venv-llmc`` (``_reference/smoothing_llmcompressor.py``, a fresh process per run,
its recipe its own defaults, its mappings its registry's); its compressed model's state comes
back and is checked to reproduce its own logits on one evaluation row, then evaluated here
with llmc-trace's perplexity on the same ``--eval-rows``; W8A8 with the activations quantized
to int8 per token as in ``smoothing_quality.py``. Seconds: ours is the whole ``compress`` call
(loading, tracing, finding and proving the pairs, calibrating), theirs ``oneshot`` alone; memory
is theirs only (the rise of the resident high-water mark during ``oneshot``). One run each.

Both tools' checkpoints are then written (ours by a second, untimed ``compress`` to a folder,
theirs by ``save_pretrained(save_compressed=True)``) and their integers compared from the
safetensors (``vlm_calibration.quantized`` and ``agreement``): the share of weight integers
identical, the largest integer step apart, and the largest relative difference of the scales.

    python benchmarks/smoothing_reference.py          # ~10 min
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import refmodel
from llmc_trace.data import load_calibration
from llmc_trace.evaluate.perplexity import perplexity
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.spec.stage import Stage

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import Run  # noqa: E402
from _worker import run_child  # noqa: E402
from smoothing_quality import activations_quantized  # noqa: E402
from vlm_calibration import agreement, quantized  # noqa: E402

THREADS = 2
SEQ_LEN = 512
REFERENCE_SCRIPT = HERE / "_reference" / "smoothing_llmcompressor.py"
#: per method: our scheme, the weights' bits, and whether activations are quantized too
METHODS = {"awq": ("W4A16", 4, False), "smoothquant+gptq": ("W8A8", 8, True)}


def ours(method: str, samples: int, rows: Any, checkpoint: Path) -> dict[str, Any]:
    """Our run in memory, timed and evaluated; then the same run written to ``checkpoint``."""
    scheme, _, _ = METHODS[method]

    def request(out_dir: Path | None) -> CompressRequest:
        stages = [Stage(method="awq", scheme=scheme)] if method == "awq" else [
            Stage(method="smoothquant"), Stage(method="gptq", scheme=scheme)
        ]  # fmt: skip
        return CompressRequest(
            str(refmodel.FOLDER), dataset=refmodel.FOLDER / "calib.npy", samples=samples,
            seq_len=SEQ_LEN, stages=stages, out_dir=out_dir,
        )  # fmt: skip

    start = time.perf_counter()
    run = compress(request(None))
    seconds = time.perf_counter() - start
    model = run.model.float()
    layers = [layer.name for layer in run.layers]
    figures = {"perplexity": evaluated(model, layers, method, rows), "seconds": seconds}
    compress(request(checkpoint))
    return figures


def evaluated(model: torch.nn.Module, layers: list[str], method: str, rows: Any) -> float:
    handles = activations_quantized(model, layers) if METHODS[method][2] else []
    try:
        return perplexity(model, rows).perplexity
    finally:
        for handle in handles:
            handle.remove()


def theirs(
    method: str, calib_rows: Path, scratch: Path, python: Path, rows: Any, checkpoint: Path
) -> dict:
    save = scratch / f"{method}.pt"
    check_row = scratch / "check_row.npy"
    np.save(check_row, rows[0])
    command = [
        str(python), str(REFERENCE_SCRIPT), str(refmodel.FOLDER), str(calib_rows),
        "--method", method, "--threads", str(THREADS), "--save", str(save),
        "--check-row", str(check_row), "--save-checkpoint", str(checkpoint),
    ]  # fmt: skip
    result = run_child(command, f"llm-compressor {method}", dict(os.environ))
    if "error" in result:
        return result
    saved = torch.load(save)
    model = load_pretrained(resolve_model(str(refmodel.FOLDER)), "sdpa", torch.float32)
    state = rounded(saved["state"], METHODS[method][1])
    missing = [name for name in state if name not in model.state_dict()]
    if missing:
        return {**result, "error": f"their state names {missing[0]}, which the model lacks"}
    model.load_state_dict(state, strict=False)
    model.eval()
    layers = [
        name for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    ]  # fmt: skip
    handles = activations_quantized(model, layers) if METHODS[method][2] else []
    with torch.no_grad():
        logits = model(input_ids=saved["check"]["input_ids"]).logits.float()
    for handle in handles:
        handle.remove()
    gap = float((logits - saved["check"]["logits"]).abs().max())
    return {
        "perplexity": evaluated(model, layers, method, rows),
        "seconds": result["oneshot_s"],
        "oneshot_rss_bytes": result["oneshot_rss_bytes"],
        "logits_gap": gap,
        "environment": result.get("environment"),
        "pinning_stood_in": result.get("pinning_stood_in"),
    }


def rounded(state: dict[str, torch.Tensor], bits: int) -> dict[str, torch.Tensor]:
    """Their weights rounded as their forward rounds them: each ``X.weight`` with an
    ``X.weight_scale`` (one per row, or per group of columns) to the symmetric ``bits``-bit
    grid; the scales and zero points themselves left out."""
    out = {}
    for name, tensor in state.items():
        if not name.endswith(("weight", "bias")) or not tensor.is_floating_point():
            continue
        scale = state.get(name + "_scale")
        if scale is not None:
            W = tensor.float()  # (out, in)
            group = W.shape[1] // scale.shape[1]
            s = scale.float().repeat_interleave(group, dim=1)
            low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
            tensor = ((W / s).round().clamp(low, high) * s).to(tensor.dtype)
        out[name] = tensor
    return out


def tables(result: dict[str, Any]) -> dict[str, str]:
    """Per method both tools' perplexity and seconds, and llm-compressor's memory; and how
    far their checkpoints' integers and scales agree."""
    figures = result["figures"]
    lines = [
        "| method | llmc-trace ppl | llm-compressor ppl | llmc-trace s | llm-compressor s "
        "| llm-compressor memory |",
        "|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        ours_, theirs_ = row["ours"], row["theirs"]
        if "error" in theirs_:
            lines.append(
                f"| {row['method']} | {ours_['perplexity']:.3f} | failed | "
                f"{ours_['seconds']:.0f} | - | - |"
            )
            continue
        lines.append(
            f"| {row['method']} | {ours_['perplexity']:.3f} | {theirs_['perplexity']:.3f} "
            f"| {ours_['seconds']:.0f} | {theirs_['seconds']:.0f} "
            f"| {theirs_['oneshot_rss_bytes'] / 2**20:.0f} MiB |"
        )
    integers = [
        "| method | identical weight integers | largest step apart | scales' largest relative "
        "difference |",
        "|---|---|---|---|",
    ]
    for row in figures["rows"]:
        if "integers" in row:
            same = row["integers"]
            integers.append(
                f"| {row['method']} | {100 * same['same'] / same['count']:.1f} % "
                f"| {same['steps']} | {100 * same['scale_rel']:.1f} % |"
            )
    return {"comparison": "\n".join(lines), "integers": "\n".join(integers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--eval-rows", type=int, default=128)
    parser.add_argument(
        "--reference-python", type=Path, default=HERE / ".venv-llmc" / "bin" / "python"
    )
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    record = Run("smoothing_reference")
    rows = np.load(refmodel.FOLDER / "eval.npy")[: args.eval_rows]
    calibration = load_calibration(
        refmodel.FOLDER / "calib.npy", samples=args.samples, seq_len=SEQ_LEN, seed=0
    )
    table = []
    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        calib_rows = scratch / "calib_rows.npy"
        used = torch.cat([batch["input_ids"] for batch in calibration.batches])  # (samples, T)
        np.save(calib_rows, used.numpy())
        for method in METHODS:
            mine, other = scratch / f"ours-{method}", scratch / f"theirs-{method}"
            row = {"method": method, "ours": ours(method, args.samples, rows, mine)}
            row["theirs"] = theirs(method, calib_rows, scratch, args.reference_python, rows, other)
            if "error" not in row["theirs"]:
                compared = agreement(quantized(mine), quantized(other))
                row["integers"] = {
                    **compared.pop("all"),
                    "only_in_one": compared.pop("only_in_one"),
                }
                row["integers_by_module"] = compared
            print(row, flush=True)
            table.append(row)
    figures = {
        "model": "refmodel", "samples": args.samples, "seq_len": SEQ_LEN,
        "eval_rows": len(rows), "threads": THREADS, "rows": table,
    }  # fmt: skip
    print(tables({"figures": figures})["comparison"])
    record.write(
        figures,
        notes=[
            "llm-compressor 0.14's AWQ pins its cached activations, which fails without an "
            "accelerator; its worker makes that pinning a no-op on this CPU.",
        ],
    )


if __name__ == "__main__":
    main()
