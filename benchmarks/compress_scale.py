"""Compress bf16 Llamas of growing size: seconds, memory against the plan, checkpoint bytes.

For each size, a random-weight bf16 Llama is built once and cached under
``benchmarks/.cache/scale/`` (``--cache`` elsewhere); then, each in a fresh process, llmc-trace's
``compress`` (GPTQ W4A16, 16 samples of 256 tokens) and, where ``benchmarks/.venv-llmc`` exists,
llm-compressor 0.14 on the same folder and token rows (``_reference/compress_scale_llmcompressor.py``:
``dtype="auto"``, ``oneshot``, ``save_pretrained(save_compressed=True)``). Each tool runs
``--repeat`` times per size (default 3), alternating with the other, so a figure is the median
of its runs with their range, and a ratio ours/theirs is taken between medians of the same run.

Per size it records: seconds (the whole call: loading, tracing, calibrating, writing; theirs:
loading, ``oneshot``, saving); the peak resident set and its growth over the same process's
resident set after ``import torch, transformers`` (and ``llmc_trace``); the checkpoint's bytes
against the ideal W4A16 size (int4 packed, bf16 group scales, every other tensor in bf16); the
plan's host (and, on a GPU, device) estimate against the pipeline's own growth (and
``torch.cuda.max_memory_allocated``): the peak over the resident set when the calibration
pipeline starts, as ``benchmarks/pipeline_memory.py`` measures it. By then the libraries have
been loaded, the model traced and the memory planned, which the plan does not count (the
libraries' first use alone, the same at every size, is tens of MiB: most of a 0.1B run's).
The library code the pipeline's kernels page in as they first run is recorded apart
(``_rss.library_code_bytes``: about 10 MiB, file pages the kernel may drop), and the plan is
held against the rest, the pipeline's data growth.

Beside each tool's figures it records what decides them, measured in the process that ran:
the tool's version (ours: the git commit, ``+dirty`` with uncommitted changes), Python, torch
(version, commit, threads, BLAS, CPU capability), transformers, and the load average before and
after each run. Ours/theirs ratios are given only when both ran the same torch build and
transformers; otherwise the result says which differ.

Our seconds are split by phase: load, trace, calibrate and write from the times at which
``compress`` reports each to its progress callback ("load", "trace", the first subgraph,
"write"); within calibration, solves from the per-layer seconds ``compress`` returns, of
which the report's baseline as timed around GPTQ's ``_rtn_error``, Hessians as timed around
``HessianAccumulator.add``, and forwards the rest of calibration. The two timers wrap the
algorithm functions in the worker process only; nothing else is changed.

Targets, side by side in one run on an idle machine: seconds ours/theirs at most 0.8 at every
size; growth ours/theirs at most 0.5; checkpoint 1.00x ideal; and, at the largest size (1.6B),
our growth at most 0.25x the checkpoint's bf16 bytes + 256 MiB; plan within 25 % of each
measured peak (the host's: the pipeline's data growth). Each is judged with the run's figures and
recorded met or missed.

The run writes ``benchmarks/results/compress_scale.json`` (``--result`` elsewhere): every
run's figures, the spreads, the settings, each tool's environment and the goals' verdicts;
``tables`` renders the printed tables (``sizes``, ``ratios``, ``phases``,
``processes``) from that file alone, as ``benchmarks/tables.py`` does for the docs.

    python benchmarks/compress_scale.py                  # 0.1B, 0.4B, 1.6B, 3 runs of each tool
    python benchmarks/compress_scale.py --sizes 0.1B 1.6B --repeat 3 1 --reference-sizes 0.1B
                                                         # 1.6B ours once (18 min on 2 AVX2 cores)
    python benchmarks/compress_scale.py --sizes 0.1B     # one size
    python benchmarks/compress_scale.py --sizes 8B --repeat 1  # Llama-3.1-8B's shape (for a GPU)
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _environment import SAME_FOR_A_RATIO, describe, environment_line, load_average  # noqa: E402
from _results import Run, goal, spread, spread_text  # noqa: E402
from _rss import library_code_bytes, peak_rss_since_reset, reset_peak_rss, resident_bytes  # noqa: E402
from _worker import failure_text, run_child  # noqa: E402
from refmodel import FOLDER as REFMODEL  # noqa: E402

REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_SCRIPT = HERE / "_reference" / "compress_scale_llmcompressor.py"
TOKENIZER = REFMODEL  # any tokenizer: llm-compressor wants one
MiB = 2**20
GiB = 2**30
SAMPLES, SEQ_LEN = 16, 256

#: Llama shapes: (hidden, intermediate, layers, heads, kv heads, vocabulary).
SIZES = {
    "0.1B": (768, 2048, 12, 12, 4, 32000),
    "0.4B": (1536, 4096, 12, 12, 4, 32000),
    "1.6B": (2048, 5632, 32, 16, 4, 32000),
    "8B": (4096, 14336, 32, 32, 8, 128256),
}
#: the size the host-memory target (growth <= 0.25 x bf16 bytes + 256 MiB) is set at
TARGET_SIZE = "1.6B"


def build(name: str, folder: Path) -> None:
    """A random bf16 Llama of shape ``SIZES[name]`` saved in ``folder`` (once)."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inner, layers, heads, kv, vocab = SIZES[name]
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inner,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(config)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    rows = np.random.default_rng(0).integers(0, vocab, (SAMPLES, SEQ_LEN), dtype=np.int64)
    np.save(partial / "calib.npy", rows)
    os.replace(partial, folder)


def ideal_bytes(folder: Path) -> tuple[int, int]:
    """(ideal W4A16 checkpoint bytes, the model's bf16 bytes), from its config on ``meta``."""
    import torch

    from llmc_trace.algorithms.scheme import W4A16
    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.source import resolve_model

    model = build_meta_model(resolve_model(str(folder)), dtype=torch.bfloat16)
    ideal = bf16 = 0
    quantized = set()
    for name, module in model.named_modules():
        if W4A16.is_target(name, module):
            rows, cols = module.weight.shape
            ideal += rows * cols // 2 + rows * (cols // 128) * 2 + 16
            quantized.add(id(module.weight))
    for param in {id(p): p for p in model.parameters()}.values():
        bf16 += param.numel() * 2
        if id(param) not in quantized:
            ideal += param.numel() * 2
    return ideal, bf16


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


class PhaseClock:
    """Seconds per phase of one ``compress``, from its progress reports and two timers."""

    PHASES = {"load": "load", "trace": "trace", "write": "write"}
    """Progress stages that start a phase; any other stage (a subgraph) is calibration."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.timers: dict[str, float] = {}

    def progress(self, stage: str, done: int, total: int) -> None:
        phase = self.PHASES.get(stage, "calibrate")
        self.started.setdefault(phase, time.perf_counter())

    def timed(self, function: Any, phase: str) -> Any:
        """`function`, adding the seconds of each call to the timer of `phase`."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.timers[phase] = self.timers.get(phase, 0.0) + elapsed

        return wrapper

    def seconds(self, start: float, end: float, solves_s: float) -> dict[str, float]:
        """Each reported phase from its start to the next one's (``end`` after the last); a
        timer that never ran (``baseline`` while ``compress`` does not ask GPTQ for it) is
        left out rather than shown as 0."""
        order = sorted(self.started.items(), key=lambda item: item[1])
        ends = [t for _, t in order[1:]] + [end]
        spans = {phase: stop - begin for (phase, begin), stop in zip(order, ends)}
        spans["load"] = spans.get("load", 0.0) + (order[0][1] - start if order else 0.0)
        calibrate = spans.pop("calibrate", 0.0)
        spans.update(self.timers)  # hessians; baseline, part of the solves
        spans["solves"] = solves_s
        spans["forwards"] = calibrate - solves_s - self.timers.get("hessians", 0.0)
        return spans


def ours(spec: dict[str, Any]) -> dict[str, Any]:
    """One ``compress`` in this fresh process."""
    import torch
    import transformers  # noqa: F401

    import llmc_trace  # noqa: F401
    from llmc_trace.algorithms.hessian import HessianAccumulator
    from llmc_trace.oneshot import CompressRequest, compress
    from llmc_trace.pipelines import sequential

    torch.set_num_threads(spec["threads"])
    baseline = resident_bytes()
    cuda = torch.cuda.is_available()
    request = CompressRequest(
        spec["model"],
        spec["data"],
        spec["out"],
        samples=SAMPLES,
        seq_len=SEQ_LEN,
        max_shard_size=spec["max_shard_size"],
    )
    clock = PhaseClock()
    # the module: `llmc_trace.algorithms.gptq` as an attribute is the function
    gptq_module = importlib.import_module("llmc_trace.algorithms.gptq")
    HessianAccumulator.add = clock.timed(HessianAccumulator.add, "hessians")
    gptq_module._rtn_error = clock.timed(gptq_module._rtn_error, "baseline")
    started: dict[str, int] = {}
    run_sequential = sequential.run_sequential

    def from_its_start(*args: Any, **kwargs: Any) -> Any:
        """The pipeline, its peak measured from what is resident when it starts, and the
        library code it pages in (``library_code_bytes``) apart."""
        started["peak_before"] = peak_rss_since_reset()
        started["resident"] = reset_peak_rss()
        started["code"] = library_code_bytes()
        try:
            return run_sequential(*args, **kwargs)
        finally:
            started["code_paged"] = library_code_bytes() - started["code"]

    sequential.run_sequential = from_its_start
    environment = describe(["llmc-trace"])
    environment["packages"]["llmc-trace"] = spec["commit"]
    load_before = load_average()
    start = time.perf_counter()
    result = compress(request, progress=clock.progress)
    end = time.perf_counter()
    seconds = end - start
    chosen = result.plan.estimate(result.pipeline)
    layers = sum(1 for passes in result.stats.passes if passes)
    peak = peak_rss_since_reset()
    return {
        "seconds": seconds,
        "seconds_per_layer": seconds / max(layers, 1),
        "phases_s": clock.seconds(start, end, sum(layer.seconds for layer in result.layers)),
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": max(peak, started.get("peak_before", 0)),
        "pipeline_growth_bytes": peak - started["resident"] if started else None,
        "pipeline_code_bytes": started.get("code_paged"),
        "pipeline_data_bytes": (
            peak - started["resident"] - started["code_paged"] if started else None
        ),
        # compress resets CUDA's peak counter per layer solve; its report keeps the run's peak
        "device_peak_bytes": (
            max(torch.cuda.max_memory_allocated(), result.report.device_peak_bytes or 0)
            if cuda
            else None
        ),
        "plan_host_bytes": chosen.host_bytes,
        "plan_device_bytes": chosen.device_bytes,
        "pipeline": result.pipeline,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "environment": environment,
        "load_before": load_before,
        "load_after": load_average(),
    }


def commit() -> str:
    """The checked-out commit, ``+dirty`` when the tracked files differ from it."""
    head = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(HERE), "diff", "--quiet", "HEAD"]).returncode
    return f"git {head or 'unknown'}{'+dirty' if dirty else ''}"


def run(command: list[str], what: str, pythonpath: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return run_child(command, what, env)


# ---- one size's runs as figures ----------------------------------------------------------------

TOOLS = ("llmc-trace", "llm-compressor")
PHASES = ["load", "trace", "forwards", "hessians", "solves", "baseline", "write"]
#: how each per-run figure is kept: the spread's name and the unit its values are divided by
SPREADS = {
    "seconds": ("seconds", 1),
    "seconds_per_layer": ("seconds_per_layer", 1),
    "growth_bytes": ("growth_mib", MiB),
    "pipeline_growth_bytes": ("pipeline_growth_mib", MiB),
    "pipeline_code_bytes": ("pipeline_code_mib", MiB),
    "pipeline_data_bytes": ("pipeline_data_mib", MiB),
    "peak_rss_bytes": ("peak_rss_mib", MiB),
    "baseline_rss_bytes": ("baseline_rss_mib", MiB),
    "device_peak_bytes": ("device_peak_mib", MiB),
    "checkpoint_bytes": ("checkpoint_bytes", 1),
}


def spread_of(runs: list[dict[str, Any]], key: str, unit: float = 1) -> dict[str, Any] | None:
    """``key`` over the runs that measured it, divided by ``unit``; None when none did."""
    measured = [r[key] / unit for r in runs if r.get(key) is not None]
    return spread(measured, digits=2 if unit != 1 else 4) if measured else None


def tool_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tool's repeats at one size: every run (less its environment, kept once apart) and
    the spreads the tables show; the plan's estimate is the same in every run."""
    done = [r for r in runs if "error" not in r]
    figures: dict[str, Any] = {
        "runs": [{k: v for k, v in r.items() if k != "environment"} for r in runs],
        "errors": [r["error"] for r in runs if "error" in r],
    }
    if not done:
        return figures
    for key, (name, unit) in SPREADS.items():
        figures[name] = spread_of(done, key, unit)
    phases = [r["phases_s"] for r in done if "phases_s" in r]
    if phases:
        figures["phases_s"] = {p: spread_of(phases, p) for p in PHASES if spread_of(phases, p)}
    for key in ("plan_host_bytes", "plan_device_bytes", "pipeline", "device"):
        if key in done[0]:
            figures[key] = done[0][key]
    packages = done[0].get("environment", {}).get("packages", {})
    figures["version"] = packages.get("llmcompressor") or packages.get("llmc-trace")
    return figures


def comparison(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Medians' ratios ours/theirs (seconds, growth), or the builds that keep them apart: a
    ratio needs both tools on the same torch build and transformers."""
    mine = [r for r in mine if "error" not in r]
    theirs = [r for r in theirs if "error" not in r]
    if not mine or not theirs:
        return None
    differ = [
        f"{key} {mine[0]['environment'][key]} vs {theirs[0]['environment'][key]}"
        for key in SAME_FOR_A_RATIO
        if mine[0].get("environment", {}).get(key) != theirs[0].get("environment", {}).get(key)
    ]
    if differ:
        return {"differ": differ, "seconds": None, "growth": None}
    ours_fig, theirs_fig = tool_figures(mine), tool_figures(theirs)
    return {
        "differ": [],
        "seconds": ours_fig["seconds"]["median"] / theirs_fig["seconds"]["median"],
        "growth": ours_fig["growth_mib"]["median"] / theirs_fig["growth_mib"]["median"],
    }


def keep_environments(
    environments: dict[str, Any], size: str, tool: str, runs: list[dict[str, Any]]
) -> None:
    """Each tool's environment once; a run that differs from it is kept under ``tool size``."""
    for r in runs:
        if "environment" not in r:
            continue
        first = environments.setdefault(tool, r["environment"])
        if r["environment"] != first:
            environments.setdefault(f"{tool} {size}", r["environment"])


# ---- tables (from the result alone) ------------------------------------------------------------


def mib(count: float | None) -> str:
    return "-" if count is None else f"{count / MiB:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def median(s: dict[str, Any] | None) -> float | None:
    return s["median"] if s else None


def tool_label(tool: str, figures: dict[str, Any]) -> str:
    """``llm-compressor 0.14`` (major.minor of what ran); ours by name only."""
    version = figures.get("version")
    if tool == "llm-compressor" and version:
        return f"{tool} {'.'.join(version.split('.')[:2])}"
    return tool


def sizes_table(figures: dict[str, Any]) -> str:
    """Per size and tool: seconds and growth (median (min-max) of the repeats), growth over the
    bf16 bytes, the checkpoint over the ideal W4A16 bytes, the plan over the pipeline's data
    growth (and the device peak)."""
    on_device = any(
        median(tool.get("device_peak_mib")) for size in figures["sizes"].values()
        for tool in size["tools"].values()
    )  # fmt: skip
    header = (
        "| size | bf16 MiB | tool | seconds | growth MiB | growth / bf16 "
        "| checkpoint / ideal W4A16 | plan host / pipeline's data growth |"
    )
    lines = [header + (" plan device / device peak |" if on_device else "")]
    lines.append("|---" * (8 + on_device) + "|")
    for name, size in figures["sizes"].items():
        bf16, ideal = size["bf16_bytes"], size["ideal_bytes"]
        for tool, r in size["tools"].items():
            label = tool_label(tool, r)
            if "seconds" not in r:
                lines.append(f"| {name} | {mib(bf16)} | {label} | failed: {r['errors'][-1]} |"
                             + " - |" * (4 + on_device))  # fmt: skip
                continue
            growth = median(r["growth_mib"]) * MiB
            pipeline = median(r.get("pipeline_data_mib"))
            cells = [
                name,
                mib(bf16),
                label,
                spread_text(r["seconds"]),
                spread_text(r["growth_mib"], ",.0f"),
                f"{growth / bf16:.2f}",
                ratio(median(r["checkpoint_bytes"]), ideal),
                ratio(r.get("plan_host_bytes"), pipeline and pipeline * MiB),
            ]
            if on_device:
                device_peak = median(r.get("device_peak_mib"))
                cells.append(ratio(r.get("plan_device_bytes"), device_peak and device_peak * MiB))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios_table(figures: dict[str, Any]) -> str:
    """Ours over theirs, medians of the same run's repeats, at each size both tools ran."""
    lines = [
        "| size | runs (ours, theirs) | seconds ours/theirs | growth ours/theirs |",
        "|---|---|---|---|",
    ]
    for name, size in figures["sizes"].items():
        compared = size.get("comparison")
        if compared is None:
            continue
        runs = ", ".join(str(len(size["tools"][t]["runs"])) for t in TOOLS)
        if compared["differ"]:
            lines.append(f"| {name} | {runs} | no ratio: {'; '.join(compared['differ'])} | - |")
        else:
            lines.append(
                f"| {name} | {runs} | {compared['seconds']:.2f} | {compared['growth']:.2f} |"
            )
    return "\n".join(lines)


def phases_table(figures: dict[str, Any]) -> str:
    """Our seconds per phase, medians of the repeats (the baseline is part of the solves)."""
    lines = [
        "| size | seconds | load | trace | forwards | Hessians | solves "
        "| of which the report's baseline | write |",
        "|---" * 9 + "|",
    ]
    for name, size in figures["sizes"].items():
        mine = size["tools"].get("llmc-trace", {})
        if "phases_s" not in mine:
            continue
        phases = mine["phases_s"]
        cells = " | ".join(f"{phases[p]['median']:.1f}" if p in phases else "-" for p in PHASES)
        lines.append(f"| {name} | {spread_text(mine['seconds'])} | {cells} |")
    return "\n".join(lines)


def processes_table(figures: dict[str, Any]) -> str:
    """What the growth is measured from: each process's resident set after its imports, its
    peak and (ours) the pipeline's growth with the library code it paged in, and our seconds
    per decoder layer (medians of the repeats)."""
    lines = [
        "| size | tool | runs | seconds per layer | RSS after imports MiB | peak RSS MiB "
        "| pipeline's growth MiB | of it, library code paged in MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, size in figures["sizes"].items():
        for tool, r in size["tools"].items():
            if "seconds" not in r:
                continue
            per_layer = median(r.get("seconds_per_layer"))
            growth, code = r.get("pipeline_growth_mib"), r.get("pipeline_code_mib")
            pipeline = spread_text(growth, ",.0f") if growth else "-"
            paged = spread_text(code, ",.1f") if code else "-"
            lines.append(
                f"| {name} | {tool_label(tool, r)} | {len(r['runs'])} | "
                f"{'-' if per_layer is None else f'{per_layer:.2f}'} | "
                f"{median(r['baseline_rss_mib']):,.0f} | {median(r['peak_rss_mib']):,.0f} | "
                f"{pipeline} | {paged} |"
            )
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The tables this benchmark prints, from its result alone: ``sizes`` (seconds,
    memory, checkpoint, plan per size and tool), ``ratios`` (ours/theirs, where both ran),
    ``phases`` (where our seconds go) and ``processes`` (the resident sets behind the growth)."""
    figures = result["figures"]
    rendered = {"sizes": sizes_table(figures)}
    if any(size.get("comparison") for size in figures["sizes"].values()):
        rendered["ratios"] = ratios_table(figures)
    rendered["phases"] = phases_table(figures)
    rendered["processes"] = processes_table(figures)
    return rendered


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary rows: ours over llm-compressor where both ran a size, and the
    largest size's growth against its weights."""
    figures = result["figures"]
    rows = []
    for name, size in figures["sizes"].items():
        compared = size.get("comparison")
        if compared and not compared["differ"]:
            rows.append(
                (
                    f"GPTQ W4A16 of a {name} Llama beside llm-compressor 0.14",
                    f"{compared['seconds']:.2f}x its seconds, {compared['growth']:.2f}x its memory growth",
                )
            )
    name, size = list(figures["sizes"].items())[-1]
    mine = size["tools"].get("llmc-trace", {})
    if "growth_mib" in mine:
        growth = median(mine["growth_mib"]) * MiB
        rows.append(
            (
                f"GPTQ W4A16 of a {name} Llama, streamed",
                f"memory grows by {growth / size['bf16_bytes']:.2f}x its bf16 weights",
            )
        )
    return rows


# ---- goals ---------------------------------------------------------------------------------------


#: (the plan's figure, the measured one it is held against, the goal's label)
PLAN_GOALS = (
    ("plan_host_bytes", "pipeline_data_mib", "plan host / pipeline's data growth"),
    ("plan_device_bytes", "device_peak_mib", "plan device / device peak"),
)


def judge(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the module's docstring, each with the figure this run measured."""
    goals = []
    for name, size in figures["sizes"].items():
        compared = size.get("comparison")
        if compared and not compared["differ"]:
            s, g = compared["seconds"], compared["growth"]
            goals.append(goal(f"{name}: seconds ours/theirs", "<= 0.8", f"{s:.2f}", s <= 0.8))
            goals.append(goal(f"{name}: growth ours/theirs", "<= 0.5", f"{g:.2f}", g <= 0.5))
        mine = size["tools"].get("llmc-trace", {})
        if "seconds" not in mine:
            continue
        checkpoint = median(mine["checkpoint_bytes"]) / size["ideal_bytes"]
        goals.append(goal(
            f"{name}: checkpoint / ideal W4A16", "1.00x", f"{checkpoint:.4f}x",
            round(checkpoint, 2) == 1.0,
        ))  # fmt: skip
        growth = median(mine["growth_mib"]) * MiB
        for plan_key, measured_key, label in PLAN_GOALS:
            measured = median(mine.get(measured_key))
            if measured:
                plan = mine[plan_key] / (measured * MiB)
                goals.append(goal(
                    f"{name}: {label}", "within 25 %", f"{plan:.2f}x", abs(plan - 1) <= 0.25
                ))  # fmt: skip
        if name == TARGET_SIZE:
            limit = 0.25 * size["bf16_bytes"] + 256 * MiB
            goals.append(goal(
                f"{name}: our growth", f"<= 0.25 x bf16 + 256 MiB = {mib(limit)} MiB",
                f"{mib(growth)} MiB", growth <= limit,
            ))  # fmt: skip
    return goals


# ---- the run -------------------------------------------------------------------------------------


def ensure_model(name: str, folder: Path) -> None:
    """Build the random model of size ``name`` in ``folder`` once, in its own process."""
    if folder.exists():
        return
    print(f"building {name} in {folder} ...", flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(HERE)!r}); "
            f"from compress_scale import build; from pathlib import Path; "
            f"build({name!r}, Path({str(folder)!r}))",
        ],
        check=True,
    )


def measure_size(
    name: str, folder: Path, args: argparse.Namespace, repeats: int, reference: bool
) -> dict[str, list[dict[str, Any]]]:
    """``repeats`` runs of each tool on one size, alternating (ours first), each in a fresh
    process writing to a scratch folder removed after it."""
    runs: dict[str, list[dict[str, Any]]] = {"llmc-trace": []}
    if reference:
        runs["llm-compressor"] = []
    for repeat in range(1, repeats + 1):
        with tempfile.TemporaryDirectory(dir=args.cache) as scratch:
            spec = {
                "model": str(folder),
                "data": str(folder / "calib.npy"),
                "out": str(Path(scratch) / "ours"),
                "threads": args.threads,
                "max_shard_size": args.max_shard_size,
                "commit": commit(),
            }
            what = f"{name} ours ({repeat}/{repeats})"
            mine = run([sys.executable, __file__, "--worker", json.dumps(spec)], what)
            if "error" not in mine:
                mine["checkpoint_bytes"] = folder_bytes(Path(spec["out"]))
                mine["growth_bytes"] = mine["peak_rss_bytes"] - mine["baseline_rss_bytes"]
            runs["llmc-trace"].append(mine)
            print(f"  {what}: {json.dumps(mine)}", flush=True)
            if reference:
                out = Path(scratch) / "theirs"
                command = [str(args.reference_python), str(REFERENCE_SCRIPT), str(folder)]
                command += [spec["data"], str(out), "--threads", str(args.threads)]
                command += ["--tokenizer", str(args.tokenizer)]
                what = f"{name} llm-compressor ({repeat}/{repeats})"
                theirs = run(command, what, args.reference_path)
                if "error" not in theirs:
                    theirs["checkpoint_bytes"] = folder_bytes(out)
                    theirs["growth_bytes"] = theirs["peak_rss_bytes"] - theirs["baseline_rss_bytes"]
                runs["llm-compressor"].append(theirs)
                print(f"  {what}: {json.dumps(theirs)}", flush=True)
    return runs


def print_environments(measured: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    """What each size's first run of each tool ran with, and the machine's load around it."""
    print()
    for name, runs in measured.items():
        for tool, tool_runs in runs.items():
            first = next((r for r in tool_runs if "environment" in r), None)
            line = first and environment_line(f"{name} {tool}", first)
            if line:
                print(line)


def print_tables(figures: dict[str, Any], goals: list[dict[str, Any]]) -> None:
    for key, table in tables({"figures": figures}).items():
        print(f"\n{key}:\n{table}")
    print()
    for g in goals:
        print(f"{g['goal']}: {g['figure']} (target {g['target']}): {g['verdict']}")


def repeats_per_size(sizes: list[str], repeat: list[int]) -> dict[str, int]:
    if len(repeat) not in (1, len(sizes)):
        raise SystemExit("--repeat takes one value, or one per size in --sizes")
    return dict(zip(sizes, repeat * len(sizes) if len(repeat) == 1 else repeat))


def run_notes(settings: dict[str, Any], figures: dict[str, Any]) -> list[str]:
    """What was run: repeats per size, where llm-compressor ran, and builds that differed."""
    notes = []
    for name, repeats in settings["repeats"].items():
        both = name in settings["reference_sizes"]
        tools = "each tool, alternating" if both else "llmc-trace only"
        notes.append(f"{name}: {repeats} run{'s' if repeats > 1 else ''} of {tools}.")
    notes.append(
        f"GPTQ W4A16 on {settings['samples']} rows of {settings['seq_len']} tokens, "
        f"{settings['threads']} torch threads, each run a fresh process; seconds and growth are "
        "median (min-max) of the runs, the phases and ratios medians."
    )
    for name, size in figures["sizes"].items():
        compared = size.get("comparison")
        if compared and compared["differ"]:
            differ = "; ".join(compared["differ"])
            notes.append(f"{name}: no ratio, the tools ran different builds ({differ}).")
    return notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.1B", "0.4B", "1.6B"], choices=SIZES)
    parser.add_argument(
        "--repeat",
        nargs="+",
        type=int,
        default=[3],
        metavar="N",
        help="runs of each tool per size: one value for every size, or one per --sizes entry",
    )
    parser.add_argument(
        "--reference-sizes",
        nargs="+",
        choices=SIZES,
        help="the sizes at which llm-compressor runs too (default: every size)",
    )
    parser.add_argument("--cache", type=Path, default=HERE / ".cache" / "scale")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-shard-size", type=int, default=5 * 10**9)
    parser.add_argument("--no-reference", action="store_true", help="llmc-trace only")
    parser.add_argument("--result", type=Path, help="where to write the result file")
    parser.add_argument("--tokenizer", type=Path, default=TOKENIZER, help=argparse.SUPPRESS)
    parser.add_argument(
        "--reference-python",
        type=Path,
        default=REFERENCE_PYTHON,
        help="the Python with llm-compressor (default: benchmarks/.venv-llmc)",
    )
    parser.add_argument(
        "--reference-path", default=None, help="PYTHONPATH for --reference-python only"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--build", nargs=2, metavar=("SIZE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build(args.build[0], Path(args.build[1]))
        return
    if args.worker:
        try:
            result = ours(json.loads(args.worker))
        except Exception as err:  # reported as a result, not a crash
            result = {"error": failure_text(err)}
        print("RESULT " + json.dumps(result), flush=True)
        return

    record = Run("compress_scale")
    repeats = repeats_per_size(args.sizes, args.repeat)
    reference = (args.reference_path or args.reference_python.exists()) and not args.no_reference
    reference_sizes = (args.reference_sizes or args.sizes) if reference else []
    print(f"load average at start: {load_average()}; threads {args.threads}", flush=True)
    measured: dict[str, dict[str, list[dict[str, Any]]]] = {}
    environments: dict[str, Any] = {}
    sizes: dict[str, Any] = {}
    for name in args.sizes:
        folder = args.cache / name
        ensure_model(name, folder)
        ideal, bf16 = ideal_bytes(folder)
        runs = measure_size(name, folder, args, repeats[name], name in reference_sizes)
        measured[name] = runs
        for tool, tool_runs in runs.items():
            keep_environments(environments, name, tool, tool_runs)
        sizes[name] = {
            "shape": dict(
                zip(["hidden", "intermediate", "layers", "heads", "kv_heads", "vocab"], SIZES[name])
            ),  # fmt: skip
            "bf16_bytes": bf16,
            "ideal_bytes": ideal,
            "tools": {tool: tool_figures(tool_runs) for tool, tool_runs in runs.items()},
            "comparison": comparison(runs["llmc-trace"], runs.get("llm-compressor", [])),
        }
    settings = {
        "sizes": args.sizes,
        "repeats": repeats,
        "reference_sizes": [s for s in args.sizes if s in reference_sizes],
        "threads": args.threads,
        "samples": SAMPLES,
        "seq_len": SEQ_LEN,
        "max_shard_size": args.max_shard_size,
    }
    figures = {"settings": settings, "sizes": sizes}
    goals = judge(figures)
    print_tables(figures, goals)
    print_environments(measured)
    record.write(
        figures,
        goals=goals,
        environments=environments,
        notes=run_notes(settings, figures),
        path=args.result,
    )
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
