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

Each run is repeated ``--repeat`` times (3 by default), each time in a fresh process, the runs
taking turns. Per run it prints samples and tokens calibrated, seconds (the whole call, then its
phases: model loading, data preparation, tracing, calibration from the first subgraph to the
end, writing), the GPTQ solves' seconds within calibration, subgraphs, calibration seconds per
subgraph (also without the solves: the forwards, Hessians and cache, the part the data
changes), samples per calibration second, the peak resident set and its growth over the
process's resident set after the imports: each as the median over the repeats with their
range. Ratios are the medians' ratios, with the range of the repeats' own ratios (repeat i of
one run against repeat i of the other), and only between runs of the same torch build and
transformers. It checks that llm-compressor's samples are llmc-trace's at batch size 1 (the
same input ids and bit-identical pixel values, sample by sample) and says so.

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
alone. The checkpoints compared are the first repeat's.

The run writes ``benchmarks/results/vlm_calibration.json`` (``_results.Run``; ``--result``
elsewhere): every repeat's figures and their spreads, the agreements, and each worker's
environment; ``tables`` renders the tables printed here from that file alone.

    python benchmarks/vlm_calibration.py                  # 16 images, 3 repeats
    python benchmarks/vlm_calibration.py --images 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _environment import SAME_FOR_A_RATIO, describe, environment_line, load_average  # noqa: E402
from _results import Run, spread, spread_text  # noqa: E402
from _rss import peak_rss_since_reset, resident_bytes  # noqa: E402
from _worker import failure_text  # noqa: E402
from compress_scale import MiB, PhaseClock, commit, run  # noqa: E402

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
    """Each quantized Linear of a pack-quantized or int-quantized checkpoint: (int8
    integers, float32 scales)."""
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
    for name in (n for n in tensors if n.endswith(".weight") and n + "_scale" in tensors):
        if not tensors[name].is_floating_point():  # int-quantized: the integers themselves
            layers[module_name(name.removesuffix(".weight"))] = (
                tensors[name],
                tensors[name + "_scale"].float(),
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
    largest integer step apart, largest dequantized difference, identical scales (share),
    largest relative difference of the scales (to ``b``'s)."""
    import torch

    rows: dict[str, Any] = {}
    totals = {
        "same": 0, "count": 0, "steps": 0, "weight": 0.0, "same_scales": 0, "scales": 0,
        "scale_rel": 0.0,
    }  # fmt: skip
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
            "scale_rel": float(((sa - sb).abs() / sb.abs().clamp(min=1e-12)).max()),
        }
        rows[name] = figures
        for key in ("same", "count", "same_scales", "scales"):
            totals[key] += figures[key]
        totals["steps"] = max(totals["steps"], figures["steps"])
        totals["weight"] = max(totals["weight"], figures["weight"])
        totals["scale_rel"] = max(totals["scale_rel"], figures["scale_rel"])
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


#: What the runs table and the ratios show of each run, in their order: (key, heading).
MEASURES = (
    ("seconds", "seconds"),
    ("s_per_subgraph", "s/subgraph"),
    ("fwd_s_per_subgraph", "fwd s/subgraph"),
    ("samples_per_s", "samples/s"),
    ("peak_rss_mib", "peak RSS MiB"),
    ("growth_mib", "growth MiB"),
)
#: The worker's figures each repeat keeps in the result file (not the reference's samples).
KEPT = ("seconds", "phases_s", "solves_s", "subgraphs", "samples", "tokens")
KEPT += ("baseline_rss_bytes", "peak_rss_bytes", "load_before", "load_after")


def summary(label: str, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's repeats as the result file keeps them: each repeat's figures, and the spread
    (median, min, max, every value in repeat order) of each timing and memory figure; the
    first error instead of the spreads when a repeat failed."""
    kept = [{key: r[key] for key in KEPT if key in r} for r in repeats]
    failed = next((r["error"] for r in repeats if "error" in r), None)
    if failed:
        return {"label": label, "error": failed, "repeats": kept}
    first = repeats[0]
    return {
        "label": label,
        "samples": first["samples"],
        "tokens": first["tokens"],
        "subgraphs": first["subgraphs"],
        "seconds": spread(r["seconds"] for r in repeats),
        "phases_s": {p: spread(r["phases_s"][p] for r in repeats) for p in PHASES},
        "solves_s": spread(r["solves_s"] for r in repeats),
        "s_per_subgraph": spread(per_subgraph(r) for r in repeats),
        "fwd_s_per_subgraph": spread(forwards_per_subgraph(r) for r in repeats),
        "samples_per_s": spread(rate(r) for r in repeats),
        "peak_rss_mib": spread(r["peak_rss_bytes"] / MiB for r in repeats),
        "growth_mib": spread(growth(r) / MiB for r in repeats),
        "repeats": kept,
    }


def runs_table(runs: dict[str, dict[str, Any]]) -> str:
    """Each run's figures, timings and memory as ``median (min-max)`` over the repeats."""
    columns = ["run", "samples", "tokens", "seconds", *PHASES, "solves", "subgraphs"]
    columns += ["s/subgraph", "fwd s/subgraph", "samples/s", "peak RSS MiB", "growth MiB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in runs.values():
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} |" + " |" * (len(columns) - 3))
            continue
        cells = [r["label"], r["samples"], r["tokens"], spread_text(r["seconds"])]
        cells += [spread_text(r["phases_s"][p], ".2f") for p in PHASES]
        cells += [spread_text(r["solves_s"], ".2f"), r["subgraphs"]]
        cells += [spread_text(r["s_per_subgraph"], ".2f")]
        cells += [spread_text(r["fwd_s_per_subgraph"], ".2f")]
        cells += [spread_text(r["samples_per_s"], ".2f")]
        cells += [spread_text(r["peak_rss_mib"], ",.0f"), spread_text(r["growth_mib"], ",.0f")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def comparable(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The fields of ``SAME_FOR_A_RATIO`` on which two environments differ."""
    return [f"{key} {a[key]} vs {b[key]}" for key in SAME_FOR_A_RATIO if a[key] != b[key]]


def ratio_text(a: dict[str, Any], b: dict[str, Any]) -> str:
    """``a``'s median over ``b``'s, then the range of the repeats' ratios (repeat i of one
    run against repeat i of the other: they ran one after the other)."""
    pairs = [x / y for x, y in zip(a["values"], b["values"])]
    median = f"{a['median'] / b['median']:.2f}x"
    if len(pairs) < 2:
        return median
    return f"{median} ({min(pairs):.2f}-{max(pairs):.2f})"


def why_no_ratio(result: dict[str, Any], a: str, b: str) -> str | None:
    """Why runs ``a`` and ``b`` have no ratio (one failed, or other builds), or ``None``."""
    runs, environments = result["figures"]["runs"], result["environments"]
    if "error" in runs[a] or "error" in runs[b]:
        return "a run failed"
    differ = comparable(environments[runs[a]["label"]], environments[runs[b]["label"]])
    return f"the runs used different builds ({'; '.join(differ)})" if differ else None


def ratios_table(result: dict[str, Any]) -> str:
    """Each pair's ratios: the medians' ratio and the range of the repeats' ratios."""
    runs = result["figures"]["runs"]
    lines = ["| ratio | " + " | ".join(h for _, h in MEASURES) + " |"]
    lines.append("|---|" + "---|" * len(MEASURES))
    for label, a, b in ratio_pairs(result["figures"]):
        if a not in runs or b not in runs:
            continue
        why = why_no_ratio(result, a, b)
        if why:
            lines.append(f"| {label} | no ratio: {why} |" + " |" * (len(MEASURES) - 1))
            continue
        cells = [ratio_text(runs[a][key], runs[b][key]) for key, _ in MEASURES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_pairs(figures: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, numerator run, denominator run) of each ratio the benchmark gives."""
    batch = figures["batch_size"]
    return [
        ("llmc-trace image/text, batch 1", "image_1", "text"),
        (f"llmc-trace image batch {batch}/batch 1", "image_batched", "image_1"),
        ("image, batch 1, llmc-trace/llm-compressor", "image_1", "reference"),
    ]


def agreement_table(pairs: dict[str, dict[str, Any]]) -> str:
    """One row per module, each pair's figures side by side; below, any module quantized in
    one checkpoint only."""
    lines = ["| module | " + " | ".join(f"{label}: same ints, max Δq, max Δw, same scales"
                                         for label in pairs) + " |"]  # fmt: skip
    lines.append("|---|" + "---|" * len(pairs))
    names = [n for n in next(iter(pairs.values())) if n != "only_in_one"]
    for name in names:
        cells = []
        for figures in pairs.values():
            f = figures.get(name)
            cells.append(
                "-"
                if f is None
                else f"{f['same'] / f['count']:.2%}, {f['steps']}, {f['weight']:.2e}, "
                f"{f['same_scales'] / f['scales']:.2%}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for label, figures in pairs.items():
        if figures["only_in_one"]:
            lines.append(f"\n{label}: quantized in one checkpoint only: "
                         f"{', '.join(figures['only_in_one'])}")  # fmt: skip
    return "\n".join(lines)


def side_by_side_table(result: dict[str, Any]) -> str:
    """llmc-trace at batch 1 beside llm-compressor: the samples, whether the image features
    reached the language model, the first layer against GPTQ on the eager model's Hessians,
    and the timings and memory with their ratio."""
    figures = result["figures"]
    ours, theirs = figures["runs"]["image_1"], figures["runs"]["reference"]
    first = figures["first_layer"]
    lines = ["| figure | llmc-trace, batch 1 | llm-compressor | llmc-trace / llm-compressor |"]
    lines.append("|---|---|---|---|")
    same = figures["same_samples"]
    lines.append(
        f"| samples (tokens) | {ours.get('samples', '-')} ({ours.get('tokens', '-')}) "
        f"| {theirs.get('samples', '-')} ({theirs.get('tokens', '-')}) "
        f"| {'identical' if same['same'] else 'differ'} |"
    )
    lines.append(
        "| image positions reaching the first decoder layer as the placeholder's embedding "
        f"| - | {figures['as_placeholder']} of {figures['image_positions']} | - |"
    )
    cells = [
        f"{f['all']['same'] / f['all']['count']:.1%}" if f else "-"
        for f in (first.get("llmc-trace batch 1"), first.get("llm-compressor"))
    ]
    lines.append(
        "| first decoder layer's integers equal to GPTQ on the eager model's Hessians "
        f"| {cells[0]} | {cells[1]} | - |"
    )
    why = why_no_ratio(result, "image_1", "reference")
    for key, heading in MEASURES:
        fmt = ",.0f" if key.endswith("mib") else ".2f"
        values = [spread_text(r[key], fmt) if key in r else "failed" for r in (ours, theirs)]
        ratio = f"no ratio: {why}" if why else ratio_text(ours[key], theirs[key])
        lines.append(f"| {heading} | {values[0]} | {values[1]} | {ratio} |")
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """Every table the benchmark prints, from the result file alone: ``runs`` (each run's
    figures over the repeats), ``ratios``, ``agreement`` (llmc-trace's batch-1 checkpoint
    against the others), ``first_layer`` (against GPTQ on the eager model's Hessians) and,
    with llm-compressor's run, ``side_by_side``."""
    figures = result["figures"]
    rendered = {"runs": runs_table(figures["runs"]), "ratios": ratios_table(result)}
    if figures.get("agreement"):
        rendered["agreement"] = agreement_table(figures["agreement"])
    if figures.get("first_layer"):
        rendered["first_layer"] = agreement_table(figures["first_layer"])
    if "reference" in figures["runs"] and "same_samples" in figures:
        rendered["side_by_side"] = side_by_side_table(result)
    return rendered


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: whether each tool's image calibration saw the images."""
    figures = result["figures"]
    first = figures["first_layer"]
    same = [
        f"{f['all']['same'] / f['all']['count']:.1%}"
        for f in (first["llmc-trace batch 1"], first["llm-compressor"])
    ]
    return [(
        "Qwen2-VL image calibration beside llm-compressor 0.14",
        f"first layer's integers equal to GPTQ on the eager model's Hessians: {same[0]} vs "
        f"{same[1]} (llm-compressor's trace leaves {figures['as_placeholder']} of "
        f"{figures['image_positions']} image positions as the placeholder)",
    )]


def agreements(
    mine: Path,
    others: dict[str, Path],
    twin: Path,
    rows: Path,
    spec: dict[str, Any],
    theirs: dict[str, Any],
) -> dict[str, Any]:
    """llmc-trace's batch-1 checkpoint against the ``others``; then the first decoder layer of
    it and of llm-compressor's against GPTQ on the eager model's Hessians; with
    llm-compressor's run, whether it saw our samples and how many image positions reached its
    first decoder layer as the placeholder's embedding."""
    figures: dict[str, Any] = {}
    reference = "llm-compressor" in others
    if reference:
        text = same_samples(twin, rows, spec, theirs)
        figures["same_samples"] = {"same": text.startswith("yes"), "text": text}
        figures["image_positions"] = theirs["image_positions"]
        figures["as_placeholder"] = theirs["as_placeholder"]
    ours = quantized(mine)
    figures["agreement"] = {
        f"vs {label}": agreement(ours, quantized(path)) for label, path in others.items()
    }
    eager = eager_first_layer(twin, rows, spec)
    checked = {"llmc-trace batch 1": ours}
    if reference:
        checked["llm-compressor"] = quantized(others["llm-compressor"])
    figures["first_layer"] = {
        label: agreement(eager, {k: v for k, v in layers.items() if k in eager})
        for label, layers in checked.items()
    }
    return figures


def notes(figures: dict[str, Any]) -> list[str]:
    """The run's facts in words, for the console and the result's notes."""
    lines = []
    if "same_samples" in figures:
        lines.append(f"same samples: {figures['same_samples']['text']}")
        lines.append(
            f"llm-compressor: {figures['as_placeholder']} of {figures['image_positions']} image "
            "positions reached the first decoder layer as the placeholder token's embedding"
        )
    return lines


def print_environments(runs: list[tuple[str, dict[str, Any]]]) -> None:
    print()
    for line in filter(None, (environment_line(label, r) for label, r in runs)):
        print(line)


def print_tables(document: dict[str, Any]) -> None:
    """The tables, each under a line saying what it is, and the run's facts between them."""
    rendered = tables(document)
    headings = {
        "runs": "Each run, median (min-max) over the repeats:",
        "ratios": "Ratios of the medians (the repeats' ratios' range):",
        "side_by_side": "llmc-trace against llm-compressor:",
        "agreement": "llmc-trace image, batch 1, against:",
        "first_layer": "The first decoder layer against GPTQ on the eager model's Hessians:",
    }
    for line in notes(document["figures"]):
        print(line)
    for key, heading in headings.items():
        if key in rendered:
            print(f"\n{heading}\n{rendered[key]}")


def plans(
    twin: Path, rows: Path, spec: dict[str, Any], args: argparse.Namespace
) -> list[tuple[str, str, Any]]:
    """(key, label, command for an output folder) of each run, llm-compressor's last when its
    venv is there."""

    def ours_command(**changes: Any) -> Any:
        plan = {**spec, **changes}
        return lambda out: [
            sys.executable, __file__, "--worker", json.dumps({**plan, "out": str(out)})
        ]  # fmt: skip

    text_len = text_seq_len(twin, rows, args.images)
    runs = [
        ("image_1", "llmc-trace image, batch 1", ours_command()),
        (
            "image_batched",
            f"llmc-trace image, batch {args.batch_size}",
            ours_command(batch_size=args.batch_size),
        ),
        (
            "text",
            "llmc-trace text (captions), batch 1",
            ours_command(modality="text", seq_len=text_len),
        ),
    ]
    if args.reference_python.exists() and not args.no_reference:
        from llmc_trace.data.calibration import visiting_order

        order = ",".join(str(i) for i in visiting_order(args.images, args.seed))

        def reference_command(out: Path) -> list[str]:
            command = [str(args.reference_python), str(REFERENCE_SCRIPT), str(twin), str(rows)]
            command += [str(out), "--order", order]
            return command + ["--seq-len", str(args.seq_len), "--threads", str(args.threads)]

        runs.append(("reference", "llm-compressor image, batch 1", reference_command))
    return runs


def measure(
    folder: Path, runs: list[tuple[str, str, Any]], repeat: int
) -> dict[str, list[dict[str, Any]]]:
    """Each run ``repeat`` times, each in a fresh process, the runs taking turns (so a change
    in the machine's load falls on all of them). The first repeat's checkpoints are kept under
    ``folder/<key>`` for the agreement; later repeats' are written, then removed."""
    measured: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in runs}
    for index in range(repeat):
        for key, label, command in runs:
            out = folder / (key if index == 0 else f"{key}-repeat")
            print(f"  {label}, repeat {index + 1} of {repeat} ...", flush=True)
            measured[key].append(run(command(out), label))
            if index:
                shutil.rmtree(out, ignore_errors=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16, help="rows drawn, all calibrated")
    parser.add_argument("--seq-len", type=int, default=256, help="image samples' token limit")
    parser.add_argument("--batch-size", type=int, default=4, help="llmc-trace's batched run")
    parser.add_argument("--seed", type=int, default=0, help="drawing and visiting order")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
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
    parser.add_argument("--result", type=Path, help="where to write the result file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ours_worker(json.loads(args.worker))
        return
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    result = Run("vlm_calibration")
    print(
        f"load average at start: {load_average()}; threads {args.threads}; twin {args.dtype}; "
        f"{args.repeat} repeats",
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
        runs = plans(twin, rows, spec, args)
        measured = measure(folder, runs, args.repeat)
        labels = {key: label for key, label, _ in runs}
        figures: dict[str, Any] = {
            "twin": TWIN,
            "dtype": args.dtype,
            "images": args.images,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "threads": args.threads,
            "attn_implementation": args.attn_implementation,
            "repeat": args.repeat,
            "runs": {key: summary(labels[key], repeats) for key, repeats in measured.items()},
        }
        firsts = {key: repeats[0] for key, repeats in measured.items()}
        checkpoints = {
            label: folder / key
            for label, key in (
                ("llm-compressor", "reference"),
                (f"llmc-trace batch {args.batch_size}", "image_batched"),
            )
            if key in firsts and "error" not in figures["runs"][key]
        }
        if "error" not in figures["runs"]["image_1"]:
            theirs = firsts.get("reference", {})
            figures |= agreements(folder / "image_1", checkpoints, twin, rows, spec, theirs)
        environments = {
            labels[key]: r["environment"] for key, r in firsts.items() if "environment" in r
        }
        print_environments([(labels[key], r) for key, r in firsts.items()])
    document = {"figures": figures, "environments": environments}
    print_tables(document)
    result.write(figures, environments=environments, notes=notes(figures), path=args.result)
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
