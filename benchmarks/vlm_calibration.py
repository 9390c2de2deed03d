"""Calibrating a Qwen2-VL twin on images: throughput and memory, against text and llm-compressor.

A random-weight twin of Qwen2-VL-2B-Instruct (``llmc_trace.twins.save.save_twin``: 2 decoder
layers, bf16, an offline tokenizer and processor) and ``--images`` drawn captioned images
(``llmc_trace.data.drawn.write_drawn_dataset``) are written to a scratch folder; then, each in a
fresh process, GPTQ W4A16 runs on them:

* llmc-trace's ``compress`` on the image rows (``pipeline="sequential"``), at batch size 1 and
  at ``--batch-size`` (rows padded to the longest in each batch);
* llmc-trace's ``compress`` on the same rows' captions alone (``modality="text"``), packed as
  text calibration packs them: ``seq_len`` is set so that the captions fill exactly as many
  windows as there are images, so both runs calibrate on the same number of samples;
* llm-compressor 0.14's ``oneshot`` as its Qwen2-VL example runs it
  (``_reference/vlm_calibration_llmcompressor.py``, in ``benchmarks/.venv-llmc``), on the same
  rows in the order llmc-trace visits them.

Per run it prints samples and tokens calibrated, seconds (the whole call, then its phases: model
loading, data preparation, tracing, calibration from the first subgraph to the end, writing),
the GPTQ solves' seconds within calibration, subgraphs, calibration seconds per subgraph (also
without the solves: the forwards, Hessians and cache, the part the data changes), samples per
calibration second, the peak resident set and its growth over the process's resident set after
the imports. Before the ratios it checks that llm-compressor's samples are llmc-trace's at
batch size 1 (the same input ids and bit-identical pixel values, sample by sample) and says
so; ratios are printed only between runs of the same torch build and transformers.

Agreement: the packed 4-bit integers and group scales of every language-model Linear in the two
checkpoints (llmc-trace at batch size 1 against llm-compressor), per module: the share of
identical integers, the largest difference in quantization steps, the largest difference of the
dequantized weights and the share of identical scales. GPTQ is chaotic in its inputs (a Hessian
summed in another order flips some roundings), so the same figures between llmc-trace at batch
size 1 and at ``--batch-size`` (the same rows, other sums) say how far apart two runs of one
tool land; neither comparison is asserted. Last, the first decoder layer of each tool's
checkpoint is compared with GPTQ on Hessians from the model's eager forward over the same
samples (``eager_first_layer``), and llm-compressor's worker counts the image positions that
reach that layer still holding the placeholder token's embedding: together they say whether a
tool calibrated on what the model computes from the images. On a CPU, llmc-trace calibrates
the bf16 twin in float32 and llm-compressor in bf16, which alone moves GPTQ's inputs;
``--dtype float32`` rewrites the twin in float32, so that the checkpoints differ by the tools
alone.

    python benchmarks/vlm_calibration.py                  # 16 images, ~5 minutes on 2 idle cores
    python benchmarks/vlm_calibration.py --images 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _environment import SAME_FOR_A_RATIO, describe, environment_line, load_average  # noqa: E402
from _rss import peak_rss_since_reset, resident_bytes  # noqa: E402
from _worker import failure_text  # noqa: E402
from compress_scale import PhaseClock, commit, mib, run  # noqa: E402

REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_SCRIPT = HERE / "_reference" / "vlm_calibration_llmcompressor.py"
TWIN = "Qwen/Qwen2-VL-2B-Instruct"
PHASES = ("load", "data", "trace", "calibrate", "write")
#: the prefixes of the language model's modules: llmc-trace writes the module paths,
#: transformers' ``save_pretrained`` (llm-compressor) Qwen2-VL's published names
LANGUAGE_MODEL_PREFIXES = ("model.language_model.", "model.")


def prepare(folder: Path, images: int, seed: int, dtype: str) -> tuple[Path, Path]:
    """The twin (in ``dtype``) and the drawn rows, written under ``folder``: (twin folder, rows
    ``.jsonl``)."""
    from llmc_trace.data.drawn import write_drawn_dataset
    from llmc_trace.twins.save import save_twin

    twin = save_twin(TWIN, folder / "twin")
    if dtype == "float32":
        to_float32(twin)
    return twin, write_drawn_dataset(folder / "data", count=images, seed=seed)


def to_float32(twin: Path) -> None:
    """Rewrite the bf16 twin's weights and config in float32. On a CPU llmc-trace calibrates a
    bf16 model in float32 and llm-compressor in bf16; in float32 both compute alike, so the
    checkpoints differ by the tools alone."""
    from safetensors.torch import load_file, save_file

    for shard in twin.glob("*.safetensors"):
        tensors = {name: tensor.float() for name, tensor in load_file(shard).items()}
        save_file(tensors, shard, metadata={"format": "pt"})
    path = twin / "config.json"
    config = json.loads(path.read_text())
    for scope in (config, *(v for v in config.values() if isinstance(v, dict))):
        if "dtype" in scope:
            scope["dtype"] = "float32"
    path.write_text(json.dumps(config, indent=2) + "\n")


def text_seq_len(twin: Path, rows: Path, samples: int) -> int:
    """The longest windows the rows' captions, packed (each followed by eos, as text calibration
    packs texts), fill ``samples`` times."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(twin)
    captions = [json.loads(line)["text"] for line in rows.read_text().splitlines()]
    tokens = sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) + 1 for c in captions)
    return tokens // samples


def ours(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``compress`` in this fresh process, timed by phase."""
    import torch
    import transformers  # noqa: F401

    import llmc_trace  # noqa: F401
    from llmc_trace import CompressRequest, compress
    from llmc_trace.oneshot import state

    torch.set_num_threads(spec["threads"])
    baseline = resident_bytes()
    request = CompressRequest(
        spec["model"],
        spec["data"],
        spec["out"],
        samples=spec["samples"],
        seq_len=spec["seq_len"],
        batch_size=spec["batch_size"],
        seed=spec["seed"],
        modality=spec["modality"],
        pipeline="sequential",
        attn_implementation=spec["attn_implementation"],
    )
    clock = PhaseClock()
    loaded: list[Any] = []
    for name in ("load_calibration", "load_multimodal_calibration"):
        setattr(state, name, clock.timed(kept(getattr(state, name), loaded), "data"))
    environment = describe(["llmc-trace"])
    environment["packages"]["llmc-trace"] = spec["commit"]
    load_before = load_average()
    start = time.perf_counter()
    result = compress(request, progress=clock.progress)
    end = time.perf_counter()
    began = clock.started
    calibration = loaded[0]
    return {
        "seconds": end - start,
        "phases_s": {
            "load": began["trace"] - start - clock.timers["data"],
            "data": clock.timers["data"],
            "trace": began["calibrate"] - began["trace"],
            "calibrate": began["write"] - began["calibrate"],
            "write": end - began["write"],
        },
        "solves_s": sum(layer.seconds for layer in result.layers),
        "subgraphs": len(result.traced.subgraphs),
        "samples": calibration.num_samples,
        "tokens": calibration.num_tokens,
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak_rss_since_reset(),
        "environment": environment,
        "load_before": load_before,
        "load_after": load_average(),
    }


def kept(function: Any, into: list[Any]) -> Any:
    """``function``, appending each result to ``into`` (the calibration set ``compress`` made)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        into.append(result)
        return result

    return wrapper


def same_samples(twin: Path, rows: Path, spec: dict[str, Any], theirs: dict[str, Any]) -> str:
    """Whether llm-compressor calibrated on llmc-trace's batch-1 samples, and if not, where not."""
    import hashlib

    import numpy as np

    from llmc_trace.data.multimodal import load_multimodal_calibration

    mine = load_multimodal_calibration(
        rows, twin, samples=spec["samples"], seq_len=spec["seq_len"], seed=spec["seed"]
    )
    if mine.shortened or mine.dropped:
        return f"no: llmc-trace shortened {mine.shortened} and dropped {mine.dropped} rows"
    for index, batch in enumerate(mine.batches):
        pixels = np.ascontiguousarray(batch["pixel_values"].numpy(), dtype=np.float32)
        if batch["input_ids"][0].tolist() != theirs["input_ids"][index]:
            return f"no: sample {index} has other input ids"
        if hashlib.sha256(pixels.tobytes()).hexdigest() != theirs["pixel_digests"][index]:
            return f"no: sample {index} has other pixel values"
    placeholders = sum(int((b["input_ids"] == mine.media_token_id).sum()) for b in mine.batches)
    return (
        f"yes: {len(mine.batches)} samples in the same order, the same input ids "
        f"({placeholders} image tokens) and bit-identical pixel values"
    )


def eager_first_layer(twin: Path, rows: Path, spec: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """GPTQ W4A16 of the first decoder layer's Linears on Hessians taken from the model's
    eager forward (float32, ``spec``'s attention) over the batch-1 samples: what a calibration
    that computes the model as transformers does gives that layer. The weights are quantized in
    the dtype the twin stores them in, as both tools quantize them (their scales follow it).
    llmc-trace's ``gptq`` and llm-compressor's ``quantize_weight`` return the same integers for
    the same Hessian (``gptq_agreement.py``), so this is either tool's answer on the true
    inputs."""
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from llmc_trace.algorithms import HessianAccumulator, QuantizationArgs, gptq
    from llmc_trace.data.multimodal import load_multimodal_calibration

    model = Qwen2VLForConditionalGeneration.from_pretrained(
        twin, dtype=torch.float32, attn_implementation=spec["attn_implementation"]
    ).eval()
    layer = model.model.language_model.layers[0]
    linears = {n: m for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    hessians = {name: HessianAccumulator(m.in_features) for name, m in linears.items()}
    for name, module in linears.items():
        module.register_forward_pre_hook(lambda _, x, h=hessians[name]: h.add(x[0].detach()))
    calibration = load_multimodal_calibration(
        rows, twin, samples=spec["samples"], seq_len=spec["seq_len"], seed=spec["seed"]
    )
    with torch.no_grad():
        for batch in calibration.batches:
            model(**batch)
    args = QuantizationArgs(num_bits=4, group_size=128, actorder="static")
    stored = getattr(torch, json.loads((twin / "config.json").read_text())["dtype"])
    layers = {}
    for name, module in linears.items():
        weight = gptq(module.weight.detach().to(stored), hessians[name].H, args).quantized
        layers[f"layers.0.{name}"] = (weight.int_weight, weight.scale.float())
    return layers


def quantized(folder: Path) -> dict[str, tuple[Any, Any]]:
    """Each quantized Linear of a pack-quantized checkpoint: (int8 integers, float32 scales)."""
    from safetensors.torch import load_file

    from llmc_trace.checkpoint.pack import unpack_from_int32

    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    bits = group["weights"]["num_bits"]
    tensors: dict[str, Any] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    layers = {}
    for name in (n for n in tensors if n.endswith(".weight_packed")):
        prefix = name.removesuffix(".weight_packed")
        shape = tuple(tensors[prefix + ".weight_shape"].tolist())
        layers[module_name(prefix)] = (
            unpack_from_int32(tensors[name], bits, shape),
            tensors[prefix + ".weight_scale"].float(),
        )
    return layers


def module_name(path: str) -> str:
    """``path`` without its language-model prefix, the same for both checkpoints' names."""
    for prefix in LANGUAGE_MODEL_PREFIXES:
        if path.startswith(prefix):
            return path.removeprefix(prefix)
    return path


def agreement(a: dict[str, tuple[Any, Any]], b: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """Per module both checkpoints quantized, and over all of them: identical integers (share),
    largest integer step apart, largest dequantized difference, identical scales (share)."""
    import torch

    rows: dict[str, Any] = {}
    totals = {"same": 0, "count": 0, "steps": 0, "weight": 0.0, "same_scales": 0, "scales": 0}
    for name in sorted(a.keys() & b.keys()):
        (qa, sa), (qb, sb) = a[name], b[name]
        group = qa.shape[1] // sa.shape[1]
        wa = qa.float() * torch.repeat_interleave(sa, group, dim=1)
        wb = qb.float() * torch.repeat_interleave(sb, group, dim=1)
        figures = {
            "same": int((qa == qb).sum()),
            "count": qa.numel(),
            "steps": int((qa.int() - qb.int()).abs().max()),
            "weight": float((wa - wb).abs().max()),
            "same_scales": int((sa == sb).sum()),
            "scales": sa.numel(),
        }
        rows[name] = figures
        for key in ("same", "count", "same_scales", "scales"):
            totals[key] += figures[key]
        totals["steps"] = max(totals["steps"], figures["steps"])
        totals["weight"] = max(totals["weight"], figures["weight"])
    rows["all"] = totals
    rows["only_in_one"] = sorted(a.keys() ^ b.keys())
    return rows


def ours_worker(spec: dict[str, Any]) -> None:
    try:
        result = ours(spec)
    except Exception as err:  # reported as a result, not a crash
        result = {"error": failure_text(err)}
    print("RESULT " + json.dumps(result), flush=True)


def per_subgraph(r: dict[str, Any]) -> float:
    return r["phases_s"]["calibrate"] / r["subgraphs"]


def forwards_per_subgraph(r: dict[str, Any]) -> float:
    """Calibration seconds per subgraph without GPTQ's solves: the part the data decides."""
    return (r["phases_s"]["calibrate"] - r["solves_s"]) / r["subgraphs"]


def rate(r: dict[str, Any]) -> float:
    return r["samples"] / r["phases_s"]["calibrate"]


def growth(r: dict[str, Any]) -> int:
    return r["peak_rss_bytes"] - r["baseline_rss_bytes"]


def print_runs(runs: list[tuple[str, dict[str, Any]]]) -> None:
    columns = ["run", "samples", "tokens", "seconds", *PHASES, "solves", "subgraphs"]
    columns += ["s/subgraph", "fwd s/subgraph", "samples/s", "peak RSS MiB", "growth MiB"]
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for label, r in runs:
        if "error" in r:
            print(f"| {label} | failed: {r['error']} |" + " |" * (len(columns) - 3))
            continue
        cells = [label, r["samples"], r["tokens"], f"{r['seconds']:.1f}"]
        cells += [f"{r['phases_s'][p]:.2f}" for p in PHASES]
        cells += [f"{r['solves_s']:.2f}", r["subgraphs"], f"{per_subgraph(r):.2f}"]
        cells += [f"{forwards_per_subgraph(r):.2f}", f"{rate(r):.2f}"]
        cells += [mib(r["peak_rss_bytes"]), mib(growth(r))]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def print_agreement(pairs: list[tuple[str, dict[str, Any]]]) -> None:
    """One row per module, each pair's figures side by side."""
    print("\n| module | " + " | ".join(f"{label}: same ints, max Δq, max Δw, same scales"
                                      for label, _ in pairs) + " |")  # fmt: skip
    print("|---|" + "---|" * len(pairs))
    names = [n for n in pairs[0][1] if n != "only_in_one"]
    for name in names:
        cells = []
        for _, figures in pairs:
            f = figures.get(name)
            cells.append(
                "-"
                if f is None
                else f"{f['same'] / f['count']:.2%}, {f['steps']}, {f['weight']:.2e}, "
                f"{f['same_scales'] / f['scales']:.2%}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    for label, figures in pairs:
        if figures["only_in_one"]:
            print(f"{label}: quantized in one checkpoint only: {', '.join(figures['only_in_one'])}")


def print_agreements(
    mine: Path,
    others: dict[str, Path],
    twin: Path,
    rows: Path,
    spec: dict[str, Any],
    theirs: dict[str, Any],
) -> None:
    """llmc-trace's batch-1 checkpoint against the ``others``; then the first decoder layer of
    it and of llm-compressor's against GPTQ on the eager model's Hessians."""
    reference = "llm-compressor" in others
    if reference:
        print(f"same samples: {same_samples(twin, rows, spec, theirs)}")
        print(
            f"llm-compressor: {theirs['as_placeholder']} of {theirs['image_positions']} image "
            "positions reached the first decoder layer as the placeholder token's embedding"
        )
    ours = quantized(mine)
    if others:
        print("\nllmc-trace image, batch 1, against:")
        print_agreement([(f"vs {label}", agreement(ours, quantized(path)))
                         for label, path in others.items()])  # fmt: skip
    eager = eager_first_layer(twin, rows, spec)
    checked = {"llmc-trace batch 1": ours}
    if reference:
        checked["llm-compressor"] = quantized(others["llm-compressor"])
    print("\nThe first decoder layer against GPTQ on the eager model's Hessians:")
    print_agreement(
        [(label, agreement(eager, {k: v for k, v in layers.items() if k in eager}))
         for label, layers in checked.items()]
    )  # fmt: skip


def comparable(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The fields of ``SAME_FOR_A_RATIO`` on which two runs differ."""
    return [
        f"{key} {a['environment'][key]} vs {b['environment'][key]}"
        for key in SAME_FOR_A_RATIO
        if a["environment"][key] != b["environment"][key]
    ]


def ratios(label: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    """``a`` over ``b``: seconds, calibration seconds per subgraph (with and without the
    solves), samples per second, peak and growth; or why there is no ratio."""
    if "error" in a or "error" in b:
        return f"{label}: no ratio: a run failed"
    differ = comparable(a, b)
    if differ:
        return f"{label}: no ratio: the runs used different builds ({'; '.join(differ)})"
    return (
        f"{label}: seconds {a['seconds'] / b['seconds']:.2f}, s/subgraph "
        f"{per_subgraph(a) / per_subgraph(b):.2f}, fwd s/subgraph "
        f"{forwards_per_subgraph(a) / forwards_per_subgraph(b):.2f}, samples/s "
        f"{rate(a) / rate(b):.2f}, peak RSS {a['peak_rss_bytes'] / b['peak_rss_bytes']:.2f}, "
        f"growth {growth(a) / growth(b):.2f}"
    )


def print_environments(runs: list[tuple[str, dict[str, Any]]]) -> None:
    print()
    for line in filter(None, (environment_line(label, r) for label, r in runs)):
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16, help="rows drawn, all calibrated")
    parser.add_argument("--seq-len", type=int, default=256, help="image samples' token limit")
    parser.add_argument("--batch-size", type=int, default=4, help="llmc-trace's batched run")
    parser.add_argument("--seed", type=int, default=0, help="drawing and visiting order")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="the twin's weights (default: bfloat16, as save_twin writes it)",
    )
    parser.add_argument(
        "--attn-implementation",
        default="eager",
        choices=("eager", "sdpa"),
        help="llmc-trace's attention kernel (default eager: llm-compressor calibrates with it)",
    )
    parser.add_argument("--no-reference", action="store_true", help="llmc-trace only")
    parser.add_argument("--reference-python", type=Path, default=REFERENCE_PYTHON)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ours_worker(json.loads(args.worker))
        return

    from llmc_trace.data.calibration import visiting_order

    reference = args.reference_python.exists() and not args.no_reference
    print(
        f"load average at start: {load_average()}; threads {args.threads}; twin {args.dtype}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="vlm-calibration-") as scratch:
        folder = Path(scratch)
        twin, rows = prepare(folder, args.images, args.seed, args.dtype)
        spec = {
            "model": str(twin),
            "data": str(rows),
            "samples": args.images,
            "seq_len": args.seq_len,
            "batch_size": 1,
            "seed": args.seed,
            "modality": "image",
            "threads": args.threads,
            "attn_implementation": args.attn_implementation,
            "commit": commit(),
        }
        plans = [
            ("llmc-trace image, batch 1", {**spec, "out": str(folder / "image-1")}),
            (
                f"llmc-trace image, batch {args.batch_size}",
                {**spec, "batch_size": args.batch_size, "out": str(folder / "image-n")},
            ),
            (
                "llmc-trace text (captions), batch 1",
                {**spec, "modality": "text", "out": str(folder / "text"),
                 "seq_len": text_seq_len(twin, rows, args.images)},
            ),
        ]  # fmt: skip
        runs = []
        for label, plan in plans:
            print(f"  {label} ...", flush=True)
            command = [sys.executable, __file__, "--worker", json.dumps(plan)]
            runs.append((label, run(command, label)))
        theirs: dict[str, Any] = {}
        if reference:
            label = "llm-compressor image, batch 1"
            print(f"  {label} ...", flush=True)
            order = visiting_order(args.images, args.seed)
            command = [str(args.reference_python), str(REFERENCE_SCRIPT), str(twin), str(rows)]
            command += [str(folder / "theirs"), "--order", ",".join(str(i) for i in order)]
            command += ["--seq-len", str(args.seq_len), "--threads", str(args.threads)]
            theirs = run(command, label)
            runs.append((label, theirs))

        print_runs(runs)
        image, batched, text = (r for _, r in runs[:3])
        print()
        print(ratios("llmc-trace image/text, batch 1", image, text))
        print(ratios(f"llmc-trace image batch {args.batch_size}/batch 1", batched, image))
        if theirs:
            print(ratios("image, batch 1, llmc-trace/llm-compressor", image, theirs))
        checkpoints = {
            label: folder / name
            for label, name, r in (
                ("llm-compressor", "theirs", theirs),
                (f"llmc-trace batch {args.batch_size}", "image-n", batched),
            )
            if r and "error" not in r
        }
        if "error" not in image:
            print_agreements(folder / "image-1", checkpoints, twin, rows, spec, theirs)
        print_environments(runs)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
