"""llm-compressor's own GPTQ ``oneshot`` with llmc-trace's ``trace_subgraphs`` swapped in.

``llmc_trace.trace_subgraphs`` keeps llm-compressor's contract, so its sequential pipeline
should calibrate through our subgraphs exactly as through its own. On the trained reference
model (``refmodel/``, bf16) and ``--samples`` rows of ``--seq-len`` tokens drawn from its
``calib.npy``, three runs, each in a fresh process:

* ``shipped``: llm-compressor 0.14's ``oneshot`` as it comes
  (``_reference/swapped_trace_llmcompressor.py`` in ``benchmarks/.venv-llmc``): the model folder
  loaded by ``oneshot``, ``GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])``,
  the sequential pipeline on ``LlamaDecoderLayer`` with its default ``tracing_ignore``, batch 1,
  the rows unshuffled, the checkpoint written by its ``output_dir``;
* ``swapped``: the same with ``llmcompressor.pipelines.sequential.pipeline.trace_subgraphs``
  replaced by ``llmc_trace.trace_subgraphs`` (llmc-trace's ``src`` on that process's path);
* ``ours``: ``llmc_trace.compress`` through the public API on the same rows, in the same order
  (its seeded visiting order is applied to the rows before llm-compressor gets them, and the
  worker checks the rows it calibrated on against them), batch 1, the sequential pipeline,
  W4A16, the attention kernel the shipped run reports.

Checks printed: which function each llm-compressor run traced with and how often (a wrapper
counts the calls), the subgraphs and their class, and how often the warning about dropped
``ignore`` names came (once is the contract: the default list names twelve functions a Llama
lacks). Then the three checkpoints' packed 4-bit integers, unpacked, per Linear and overall, as
the share that is identical, for (a) swapped against ours, (b) shipped against ours, (c)
swapped against shipped, with the largest difference in quantization steps and the share of
identical group scales. Last, the first decoder layer's Hessians as each run handed them to
GPTQ (each normalized by its mean diagonal: llm-compressor divides by samples, llmc-trace by
tokens), pairwise: that layer's inputs do not depend on any quantization yet, so where its
integers differ these say whether the inputs did. Then, on the shipped run's first-layer
Hessians, our GPTQ against that run's integers (anything but the Hessians that differs shows
here), and llm-compressor's sweep alone (``_reference/gptq_sweep_llmcompressor.py``) with our
scales in the model's dtype and in float32, against ours. Nothing is asserted.

On a CPU llm-compressor computes a bf16 model in bf16 and llmc-trace in float32, and its GPTQ
sweep dequantizes each column in the scales' dtype (bf16), so (a) and (b) include both;
``--dtype float32`` gives both tools a float32 copy of the model, so that they differ by their
own float sums alone.

    python benchmarks/swapped_trace.py                       # 16 x 256 tokens, ~5 min on 2 busy cores
    python benchmarks/swapped_trace.py --dtype float32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _environment import describe, environment_line, load_average  # noqa: E402
from _worker import failure_text  # noqa: E402
from compress_scale import commit, run  # noqa: E402
from refmodel import FOLDER as REFMODEL  # noqa: E402
from vlm_calibration import agreement, kept, quantized, to_float32  # noqa: E402

REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_SCRIPT = HERE / "_reference" / "swapped_trace_llmcompressor.py"
SWEEP_SCRIPT = HERE / "_reference" / "gptq_sweep_llmcompressor.py"
SRC = HERE.parent / "src"
FIRST_LAYER = "model.layers.0."
#: what a float32 copy of the reference model needs: weights, config, tokenizer
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
PAIRS = (
    ("(a) swapped / ours", "swapped", "ours"),
    ("(b) shipped / ours", "shipped", "ours"),
    ("(c) swapped / shipped", "swapped", "shipped"),
)
DROPPED = "dropped from ignore"


def prepare(folder: Path, samples: int, seq_len: int, seed: int, dtype: str) -> dict[str, Path]:
    """The model folder and the rows, under ``folder``: ``rows`` as ``compress`` is given them
    (drawn from ``calib.npy`` with ``seed``), ``ordered`` as it visits them (what
    llm-compressor calibrates on, unshuffled)."""
    import numpy as np
    import torch

    from llmc_trace.data import load_calibration

    model = REFMODEL
    if dtype == "float32":
        model = folder / "refmodel-float32"
        model.mkdir()
        for name in MODEL_FILES:
            shutil.copy(REFMODEL / name, model / name)
        to_float32(model)
    paths = {"model": model, "rows": folder / "rows.npy", "ordered": folder / "ordered.npy"}
    for source, target in ((REFMODEL / "calib.npy", "rows"), (paths["rows"], "ordered")):
        calibration = load_calibration(source, samples=samples, seq_len=seq_len, seed=seed)
        rows = torch.cat([batch["input_ids"] for batch in calibration.batches])
        np.save(paths[target], rows.numpy())
    return paths


def ours(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``compress`` in this fresh process; the first layer's Hessians saved as GPTQ got
    them, and whether its samples were llm-compressor's rows, in order."""
    import numpy as np
    import torch

    from llmc_trace import CompressRequest, compress
    from llmc_trace.oneshot import state
    from llmc_trace.calibrate.solve import LayerSolver

    torch.set_num_threads(spec["threads"])
    hessians: dict[str, Any] = {}
    solve = LayerSolver._compress

    def keep_first_layer(self: Any, name: str, layer: Any, H: Any, **kwargs: Any) -> Any:
        if name.startswith(FIRST_LAYER):
            hessians[name] = H.clone()  # GPTQ may overwrite H in place at its last use
        return solve(self, name, layer, H, **kwargs)

    LayerSolver._compress = keep_first_layer
    loaded: list[Any] = []
    state.load_calibration = kept(state.load_calibration, loaded)
    request = CompressRequest(
        spec["model"],
        spec["rows"],
        spec["out"],
        samples=spec["samples"],
        seq_len=spec["seq_len"],
        batch_size=1,
        seed=spec["seed"],
        pipeline="sequential",
        scheme="W4A16",
        sequential_targets=("LlamaDecoderLayer",),
        attn_implementation=spec["attn_implementation"],
    )
    environment = describe(["llmc-trace"])
    environment["packages"]["llmc-trace"] = spec["commit"]
    load_before = load_average()
    start = time.perf_counter()
    result = compress(request)
    seconds = time.perf_counter() - start
    torch.save(hessians, spec["hessians"])
    visited = torch.cat([batch["input_ids"] for batch in loaded[0].batches]).numpy()
    return {
        "seconds": seconds,
        "solves_s": sum(layer.seconds for layer in result.layers),
        "subgraphs": len(result.traced.subgraphs),
        "pipeline": result.pipeline,
        "attn_implementation": spec["attn_implementation"],
        "same_rows": bool(np.array_equal(visited, np.load(spec["ordered"]))),
        "environment": environment,
        "load_before": load_before,
        "load_after": load_average(),
    }


def theirs(
    paths: dict[str, Path], folder: Path, swap: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One llm-compressor ``oneshot``, as shipped or with our ``trace_subgraphs``."""
    label = "swapped" if swap else "shipped"
    command = [str(args.reference_python), str(REFERENCE_SCRIPT), str(paths["model"])]
    command += [str(paths["ordered"]), str(folder / label), "--threads", str(args.threads)]
    command += ["--hessians", str(folder / f"{label}.hessians.pt")]
    print(f"  llm-compressor, {label} ...", flush=True)
    # llmc-trace's source on the path of the swapped run only
    return run([*command, "--swap"] if swap else command, label, str(SRC) if swap else "")


def hessian_gap(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str]:
    """The largest difference of two runs' first-layer Hessians, each over its mean diagonal,
    relative to the largest entry, and the Linear where it is."""
    gaps = {}
    for name in sorted(a.keys() & b.keys()):
        ha, hb = a[name] / a[name].diagonal().mean(), b[name] / b[name].diagonal().mean()
        gaps[name] = float((ha - hb).abs().max() / hb.abs().max())
    worst = max(gaps, key=lambda name: gaps[name])
    return gaps[worst], worst


def our_first_layer(hessians: dict[str, Any], model_dir: Path) -> dict[str, tuple[Any, Any]]:
    """Our GPTQ W4A16 on ``hessians`` (the first-layer Hessians a run handed its GPTQ) and the
    model's weights as stored: (weight, :class:`QuantizedWeight`) per Linear."""
    from safetensors.torch import load_file

    from llmc_trace.algorithms import gptq
    from llmc_trace.algorithms.scheme import W4A16

    weights = load_file(model_dir / "model.safetensors")
    return {
        name: (
            weights[f"{name}.weight"],
            gptq(weights[f"{name}.weight"], H, W4A16.weights).quantized,
        )
        for name, H in hessians.items()
    }


def integers(layers: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """(integers, float32 scales) per Linear, named as :func:`quantized` names them."""
    return {
        name.removeprefix("model."): (q.int_weight, q.scale.float())
        for name, (_, q) in layers.items()
    }


def their_sweep(
    hessians: dict[str, Any],
    layers: dict[str, tuple[Any, Any]],
    scale_dtype: str,
    folder: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """llm-compressor's GPTQ sweep alone (``_reference/gptq_sweep_llmcompressor.py``) on the
    same Hessians, weights and our scales, given in ``scale_dtype`` (the model's dtype, as its
    own run holds them, or ``float32``), against our integers. compressed-tensors
    dequantizes in the scale's dtype inside the sweep, so with bf16 scales the error each
    column passes on is taken against a value rounded to bf16."""
    import torch

    sent = [
        {
            "name": name,
            "W": weight,
            "H": hessians[name],
            "scale": q.scale.to(getattr(torch, scale_dtype)),
            "zero_point": q.zero_point,
            "bits": q.args.num_bits,
            "group_size": q.args.group_size,
        }
        for name, (weight, q) in layers.items()
    ]
    torch.save(sent, folder / "sweep_in.pt")
    command = [str(args.reference_python), str(SWEEP_SCRIPT), str(folder / "sweep_in.pt")]
    command += [str(folder / "sweep_out.pt"), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": ""}  # the reference venv alone, as in the shipped run
    child = subprocess.run(command, capture_output=True, text=True, env=env)
    if child.returncode != 0:
        tail = (child.stderr or child.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {child.returncode}"}
    theirs = {}
    for layer in torch.load(folder / "sweep_out.pt"):
        scale = layer["scale"].float()
        steps = layer["Q"].float() / torch.repeat_interleave(scale, layer["group_size"], dim=1)
        theirs[layer["name"].removeprefix("model.")] = (steps.round().to(torch.int8), scale)
    return agreement(integers(layers), theirs)["all"]


def print_first_layer(
    hessians: dict[str, dict[str, Any]],
    checkpoints: dict[str, dict[str, Any]],
    pairs: list[tuple[str, str, str]],
    folder: Path,
    model_dir: Path,
    args: argparse.Namespace,
) -> None:
    """Where the first decoder layer's integers part: the Hessians each run handed GPTQ,
    pairwise; our GPTQ on the shipped run's Hessians against its integers; and llm-compressor's
    sweep alone on those Hessians with our scales, in the model's dtype and in float32."""
    print("\nFirst decoder layer's Hessians, each over its mean diagonal:")
    for label, a, b in pairs:
        gap, where = hessian_gap(hessians[a], hessians[b])
        print(f"  {label}: largest difference {gap:.2e} of the largest entry ({where})")
    if "shipped" not in checkpoints:
        return
    layers = our_first_layer(hessians["shipped"], model_dir)
    same = agreement(integers(layers), checkpoints["shipped"])["all"]
    print(
        f"  our GPTQ on the shipped run's Hessians against its integers: {share(same)} "
        f"identical, scales {same['same_scales'] / same['scales']:.2%}"
    )
    for scale_dtype in dict.fromkeys((args.dtype, "float32")):
        figures = their_sweep(hessians["shipped"], layers, scale_dtype, folder, args)
        outcome = figures["error"] if "error" in figures else f"{share(figures)} identical"
        print(
            f"  llm-compressor's sweep alone on the same Hessians, weights and our scales in "
            f"{scale_dtype}, against ours: {outcome}"
        )


def share(figures: dict[str, Any]) -> str:
    return f"{figures['same'] / figures['count']:.2%}"


def decoder_layer(name: str) -> str:
    """``layers.N`` of a module name (``layers.N.mlp.up_proj``), as the checkpoints share it."""
    return ".".join(name.split(".")[:2])


def print_agreement(compared: dict[str, dict[str, Any]]) -> None:
    """Identical integers per Linear, per decoder layer and overall, for each pair."""
    labels = [label for label, _, _ in PAIRS if label in compared]
    names = [name for name in compared[labels[0]] if name not in ("all", "only_in_one")]
    print("\n| Linear | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name in names:
        print(f"| {name} | " + " | ".join(share(compared[label][name]) for label in labels) + " |")
    print("\n| decoder layer | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for layer in dict.fromkeys(decoder_layer(name) for name in names):
        cells = []
        for label in labels:
            inside = [compared[label][name] for name in names if decoder_layer(name) == layer]
            cells.append(share({key: sum(f[key] for f in inside) for key in ("same", "count")}))
        print(f"| {layer} | " + " | ".join(cells) + " |")
    print("\n| pair | identical integers | max Δq | identical scales | Linears in one only |")
    print("|---|---|---|---|---|")
    for label in labels:
        total, alone = compared[label]["all"], compared[label]["only_in_one"]
        print(
            f"| {label} | {share(total)} | {total['steps']} "
            f"| {total['same_scales'] / total['scales']:.2%} | {', '.join(alone) or 'none'} |"
        )


def print_checks(runs: dict[str, dict[str, Any]]) -> None:
    """Which tracer each llm-compressor run used, how often, and the ignore warnings."""
    print()
    for label in ("shipped", "swapped"):
        r = runs[label]
        if "error" in r:
            continue
        calls = r["trace_calls"]
        functions = sorted({call["function"] for call in calls})
        print(
            f"{label}: {len(calls)} call(s) of {', '.join(functions)}; "
            f"{', '.join(str(c['subgraphs']) for c in calls)} subgraphs of "
            f"{', '.join(sorted({c['subgraph_class'] for c in calls}))}; "
            f"trace {sum(c['seconds'] for c in calls):.2f} s; oneshot {r['seconds']:.1f} s "
            f"(GPTQ solves {r['solves_s']:.1f} s); "
            f"{r['dtype']}, attention {r['attn_implementation']}"
        )
        if label == "swapped":
            dropped = [m for m in r["llmc_trace_warnings"] if m.startswith(DROPPED)]
            print(f"  llmc_trace imported from {r['llmc_trace_file']}")
            print(f"  ignore passed: {calls[0]['ignore'] if calls else '-'}")
            print(f"  warning about dropped ignore names: {len(dropped)} time(s)")
            for message in dropped:
                print(f"    {message}")
    if "error" not in runs["ours"]:
        r = runs["ours"]
        print(
            f"ours: {r['subgraphs']} subgraphs, pipeline {r['pipeline']}, compress "
            f"{r['seconds']:.1f} s (GPTQ solves {r['solves_s']:.1f} s), attention "
            f"{r['attn_implementation']}, calibrated on llm-compressor's rows in order: "
            f"{'yes' if r['same_rows'] else 'NO'}"
        )


def print_environments(runs: dict[str, dict[str, Any]]) -> None:
    print()
    for line in filter(None, (environment_line(label, r) for label, r in runs.items())):
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16, help="calibration rows (16)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per row (256)")
    parser.add_argument("--seed", type=int, default=0, help="which rows, in which order")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="the model as both tools get it (default: refmodel's own bf16)",
    )
    parser.add_argument("--reference-python", type=Path, default=REFERENCE_PYTHON)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        try:
            result = ours(json.loads(args.worker))
        except Exception as err:  # reported as a result, not a crash
            result = {"error": failure_text(err)}
        print("RESULT " + json.dumps(result), flush=True)
        return
    if not args.reference_python.exists():
        sys.exit(
            f"needs llm-compressor in {args.reference_python}: bash benchmarks/reference_env.sh"
        )

    import torch

    print(
        f"load average at start: {load_average()}; threads {args.threads}; refmodel {args.dtype}; "
        f"{args.samples} x {args.seq_len} tokens, seed {args.seed}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="swapped-trace-") as scratch:
        folder = Path(scratch)
        paths = prepare(folder, args.samples, args.seq_len, args.seed, args.dtype)
        runs = {"shipped": theirs(paths, folder, False, args)}
        runs["swapped"] = theirs(paths, folder, True, args)
        attention = runs["shipped"].get("attn_implementation", "sdpa")
        spec = {
            "model": str(paths["model"]),
            "rows": str(paths["rows"]),
            "ordered": str(paths["ordered"]),
            "out": str(folder / "ours"),
            "hessians": str(folder / "ours.hessians.pt"),
            "samples": args.samples,
            "seq_len": args.seq_len,
            "seed": args.seed,
            "threads": args.threads,
            "attn_implementation": attention,
            "commit": commit(),
        }
        print("  llmc-trace compress ...", flush=True)
        runs["ours"] = run([sys.executable, __file__, "--worker", json.dumps(spec)], "ours")
        print_checks(runs)
        done = [label for label, r in runs.items() if "error" not in r]
        checkpoints = {label: quantized(folder / label) for label in done}
        hessians = {label: torch.load(folder / f"{label}.hessians.pt") for label in done}
        pairs = [(label, a, b) for label, a, b in PAIRS if a in done and b in done]
        if pairs:
            print_agreement(
                {label: agreement(checkpoints[a], checkpoints[b]) for label, a, b in pairs}
            )
            print_first_layer(hessians, checkpoints, pairs, folder, paths["model"], args)
        print_environments(runs)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
