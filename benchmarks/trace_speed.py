"""Time tracing full-size models on ``meta``: llmc-trace against llm-compressor 0.14, same run.

For each model (default: Llama-3.1-70B, 80 layers, and DeepSeek-V3, 61 layers) the full-size
model is built on ``meta`` from its config and traced on one text batch (batch 1, 32 tokens,
``attempt_trace``'s default), with the decoder-layer class as sequential target:

* ``trace``: llmc-trace's ``trace_graph`` + ``partition_trace``, against llm-compressor's
  ``trace_subgraphs`` (which traces and partitions), with torch's default threads and again on
  one CPU core (``taskset -c 0``, ``torch.set_num_threads(1)``);
* ``attempt``: llmc-trace's whole ``attempt_trace`` on one core (build on meta, trace,
  partition, build the tiny twin, trace it and verify its subgraphs against eager), against
  llm-compressor's ``trace_subgraphs`` on one core (it has no verification step). Target: under
  5 s for 80 layers.

llm-compressor runs in ``benchmarks/.venv-llmc`` (``bash benchmarks/reference_env.sh``) with the
same transformers, on a model built from the same config folder in the same dtype, on the very
sample llmc-trace traced (passed as a file), with its default ignore list. Without that venv
only llmc-trace's numbers are printed.

Every measurement runs in a fresh process, so its peak resident set (``ru_maxrss``: torch and
the tool's imports included) is its own; the second RSS figure is the growth during the first
traced call. Each process traces twice: the 1st call is what one command costs, one-time costs
included (lazy imports, first use of each meta kernel), the 2nd call is the trace alone. Runs
of the two tools alternate, so a busy CPU slows both alike; the result file records the load
average before and after.

The second part times whole ``llmc-trace`` commands as a user runs them (fresh process, wall
clock) on the models that used to take seconds to minutes (vision-language models, which run a
vision tower the trace does not enter; 128-expert MoEs; a 71-head model whose twin did not
shrink), with ``trace_s`` as ``attempt --json`` reports it, then ``llmc-trace --help`` and the
whole ``llmc-trace coverage`` run (each command, and coverage, ``--runs`` times). Targets:
``trace_s`` under 1 s for every row and every coverage pair, coverage under 3 minutes, Qwen2-VL
with an image (``--fix``) within 2x of the same command with text, ``--help`` under 1 s.
llm-compressor has no such commands (its tracer takes a loaded model and a processed sample),
so these rows are ours alone.

Each part writes its result file: ``benchmarks/results/trace_speed.json`` (the traces: every
process's seconds as a spread, memory, subgraph counts, the attempt's stages, the goals) and
``benchmarks/results/trace_speed-commands.json`` (the commands and coverage), or both under
``--results-dir``; ``tables(result)`` renders the tables printed here and in the docs from
either.

    python benchmarks/trace_speed.py                  # 5 runs per measurement, both parts
    python benchmarks/trace_speed.py --runs 9
    python benchmarks/trace_speed.py --part commands  # the commands and coverage only
    python benchmarks/trace_speed.py --quick --results-dir /tmp  # Llama-3.1-8B, 1 run: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal, spread, spread_text  # noqa: E402
from _rss import peak_rss_since_reset, reset_peak_rss  # noqa: E402

REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_WORKER = HERE / "_reference" / "trace_llmcompressor.py"
MODELS = ["meta-llama/Llama-3.1-70B", "deepseek-ai/DeepSeek-V3"]
QUICK_MODELS = ["meta-llama/Llama-3.1-8B"]
SEQ_LEN = 32  # attempt_trace's default
ONE_CORE_TARGET_S = 5.0
TRACE_TARGET_S = 1.0
COVERAGE_TARGET_S = 180.0
HELP_TARGET_S = 1.0
IMAGE_OVER_TEXT_TARGET = 2.0
#: (label, ``llmc-trace`` arguments): the commands a user waited on, with the fix each needs.
COMMANDS = [
    (
        "SmolVLM-Instruct, image",
        "attempt --model HuggingFaceTB/SmolVLM-Instruct --modality image "
        "--tracing-ignore Idefics3Model.inputs_merger",
    ),
    (
        "Qwen2-VL-2B, image",
        "attempt --model Qwen/Qwen2-VL-2B-Instruct --modality image "
        "--tracing-ignore Qwen2VLModel.get_rope_index",
    ),
    (
        "Qwen2-VL-2B, image, --fix",
        "attempt --model Qwen/Qwen2-VL-2B-Instruct --modality image --fix",
    ),
    ("Qwen2-VL-2B, text, --fix", "attempt --model Qwen/Qwen2-VL-2B-Instruct --modality text --fix"),
    (
        "Qwen2-VL-2B, video, --fix",
        "attempt --model Qwen/Qwen2-VL-2B-Instruct --modality video --fix",
    ),
    (
        "LLaVA-1.5-7B, image, --fix",
        "attempt --model llava-hf/llava-1.5-7b-hf --modality image --fix",
    ),
    ("DeepSeek-V3", "attempt --model deepseek-ai/DeepSeek-V3"),
    ("Switch-large-128", "attempt --model google/switch-large-128"),
    ("Falcon-7B-instruct", "attempt --model tiiuae/falcon-7b-instruct"),
    ("--help", "--help"),
]
CLI = Path(sys.executable).with_name("llmc-trace")  # the command a user types, as installed
IMAGE_ROW, TEXT_ROW = "Qwen2-VL-2B, image, --fix", "Qwen2-VL-2B, text, --fix"
CALL_KEYS = ("first_s", "second_s")
MiB = 1024 * 1024


# ---------------------------------------------------------------- measuring (child process)
def measure_ours(what: str, model_name: str, sample_path: str, targets: list[str]) -> dict:
    """Timed calls of llmc-trace in this process: ``trace`` twice or ``attempt`` once."""
    import torch

    from llmc_trace.attempt.prove import attempt_trace
    from llmc_trace.graph.partition import partition_trace
    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.source import resolve_model
    from llmc_trace.tracing.options import TracingOptions
    from llmc_trace.tracing.trace import trace_graph

    result: dict[str, object] = {}
    if what == "trace":
        model = build_meta_model(resolve_model(model_name))
        sample = torch.load(sample_path)

        def call() -> int:
            options = TracingOptions(sequential_targets=tuple(targets))
            return len(partition_trace(trace_graph(model, sample, options)).subgraphs)

        result.update(time_calls(call, calls=2))
    else:
        report = None

        def call() -> int:
            nonlocal report
            report = attempt_trace(model_name, seq_len=SEQ_LEN)
            return len(report.subgraphs)

        result.update(time_calls(call, calls=1))
        assert report is not None
        result["stages_s"] = report.timings_s
        if not report.ok:
            result["error"] = "attempt_trace did not verify: " + (
                report.failure.exception if report.failure else "verification mismatch"
            )
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def time_calls(call: Callable[[], int], calls: int) -> dict[str, object]:
    """Seconds of each call (``first_s``, ``second_s``), and the first call's RSS growth."""
    try:
        before, exact = reset_peak_rss(), True
    except OSError:  # the high-water mark cannot be reset here: no RSS figure
        before, exact = 0, False
    result: dict[str, object] = {}
    for key in CALL_KEYS[:calls]:
        start = time.perf_counter()
        result["num_subgraphs"] = call()
        result[key] = time.perf_counter() - start
        if exact and key == "first_s":
            result["trace_rss_bytes"] = peak_rss_since_reset() - before
    return result


# ---------------------------------------------------------------- orchestrating (parent)
@dataclass(frozen=True)
class ModelCase:
    """A model to trace and what both tools need to trace it identically."""

    name: str
    config_dir: Path
    sample_path: Path
    targets: list[str]
    dtype: str
    num_layers: int


def prepare_case(name: str, workdir: Path) -> ModelCase:
    """Resolve ``name``, write its config folder (if it has none) and the shared sample."""
    import torch

    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.samples import SampleOptions, make_sample
    from llmc_trace.models.source import resolve_model
    from llmc_trace.tracing.targets import default_target_patterns

    source = resolve_model(name)
    model = build_meta_model(source)
    safe = re.sub(r"[^A-Za-z0-9.-]", "_", name)
    config_dir = source.folder
    if config_dir is None:
        config_dir = workdir / safe
        model.config.save_pretrained(config_dir)
    sample_path = workdir / f"{safe}.sample.pt"
    torch.save(make_sample(model.config, "text", SampleOptions(seq_len=SEQ_LEN)), sample_path)
    text = getattr(model.config, "text_config", None) or model.config
    return ModelCase(
        name=name,
        config_dir=config_dir,
        sample_path=sample_path,
        targets=default_target_patterns(model, list(model.named_modules())),
        dtype=str(model.dtype).removeprefix("torch."),
        num_layers=int(getattr(text, "num_hidden_layers", 0) or 0),
    )


def ours_command(case: ModelCase, what: str, threads: int) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure",
        what,
        "--model",
        case.name,
        "--sample",
        str(case.sample_path),
        "--targets",
        *case.targets,
        "--threads",
        str(threads),
    ]


def reference_command(case: ModelCase, threads: int) -> list[str]:
    return [
        str(REFERENCE_PYTHON),
        str(REFERENCE_WORKER),
        str(case.config_dir),
        str(case.sample_path),
        "--targets",
        *case.targets,
        "--dtype",
        case.dtype,
        "--threads",
        str(threads),
    ]


def run_child(command: list[str], one_core: bool) -> dict:
    """Run one measurement in a fresh process and parse its ``RESULT`` line."""
    env = dict(os.environ)
    if one_core:
        command = ["taskset", "-c", "0", *command]
        env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit code {done.returncode}: {tail}"}


def run_alternating(
    ours: list[str], theirs: list[str] | None, one_core: bool, runs: int
) -> tuple[list[dict], list[dict] | None]:
    """Alternate the two tools ``runs`` times, so load on the machine hits both alike."""
    ours_results, theirs_results = [], []
    for _ in range(runs):
        ours_results.append(run_child(ours, one_core))
        if theirs is not None:
            theirs_results.append(run_child(theirs, one_core))
    return ours_results, theirs_results if theirs is not None else None


def summarize(results: list[dict] | None, key: str) -> dict[str, Any] | None:
    """The ``key`` seconds (``first_s`` or ``second_s``) of several processes' results, as a
    spread, with the median memory figures, the subgraph count and the first error."""
    if results is None:
        return None
    errors = [r["error"] for r in results if "error" in r]
    good = [r for r in results if key in r]
    deltas = [r["trace_rss_bytes"] for r in good if "trace_rss_bytes" in r]
    return {
        "seconds": spread(r[key] for r in good) if good else None,
        "peak_rss_mib": (
            round(statistics.median(r["peak_rss_bytes"] for r in good) / MiB, 1) if good else None
        ),
        "trace_rss_mib": round(statistics.median(deltas) / MiB, 1) if deltas else None,
        "num_subgraphs": good[0]["num_subgraphs"] if good else None,
        "error": errors[0] if errors else (None if good else "no result"),
    }


def stage_spreads(results: list[dict]) -> dict[str, Any]:
    """``attempt_trace``'s own timings (seconds per stage) over several processes."""
    stages = [r["stages_s"] for r in results if "stages_s" in r]
    if not stages:
        return {}
    return {name: spread(s.get(name, 0.0) for s in stages) for name in stages[0]}


def measure_case(case: ModelCase, runs: int, reference: bool) -> dict[str, Any]:
    """Every row of one model (trace on all threads and on one core, attempt on one core), and
    the attempt's stages."""
    rows: list[dict[str, Any]] = []
    theirs_one_core: list[dict] | None = None
    environment = None
    for cores, one_core in (("all threads", False), ("one core", True)):
        threads = 1 if one_core else 0
        theirs_command = reference_command(case, threads) if reference else None
        ours, theirs = run_alternating(
            ours_command(case, "trace", threads), theirs_command, one_core, runs
        )
        for call, key in (("1st call", "first_s"), ("2nd call", "second_s")):
            label = f"trace, {call}, {cores}"
            rows.append(
                {"label": label, "ours": summarize(ours, key), "theirs": summarize(theirs, key)}
            )
            print(f"  {case.name}: {label} measured", file=sys.stderr)
        if one_core:
            theirs_one_core = theirs
        reported = [r["environment"] for r in theirs or [] if "environment" in r]
        environment = environment or (reported[0] if reported else None)
    # llm-compressor has no attempt (no verification): compare with its one-core first trace
    attempt, _ = run_alternating(ours_command(case, "attempt", 1), None, True, runs)
    rows.append(
        {
            "label": "attempt, 1st call, one core",
            "ours": summarize(attempt, "first_s"),
            "theirs": summarize(theirs_one_core, "first_s"),
        }
    )
    return {
        "name": case.name,
        "num_layers": case.num_layers,
        "dtype": case.dtype,
        "targets": case.targets,
        "rows": rows,
        "attempt_stages_s": stage_spreads(attempt),
        "llmcompressor_environment": environment,
    }


def ratio(row: dict[str, Any]) -> float | None:
    """llmc-trace's median over llm-compressor's, both of this row (the same run)."""
    ours, theirs = row["ours"], row["theirs"]
    if not theirs or not theirs["seconds"] or not ours["seconds"]:
        return None
    return ours["seconds"]["median"] / theirs["seconds"]["median"]


# ---------------------------------------------------------------- whole commands
def time_command(arguments: str) -> tuple[float, float | None, str | None]:
    """Wall seconds of one ``llmc-trace`` command in a fresh process, its ``trace_s``, an error."""
    command = [str(CLI), *arguments.split()]
    if arguments.startswith("attempt"):
        command.append("--json")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return wall, None, f"exit code {done.returncode}: {done.stderr.strip()[-200:]}"
    if not arguments.startswith("attempt"):
        return wall, None, None
    report = json.loads(done.stdout)
    return wall, report["timings_s"]["trace_s"], None


def time_coverage() -> tuple[float, list[dict[str, Any]]]:
    """Wall seconds of the whole ``llmc-trace coverage --json`` in a fresh process, its rows."""
    start = time.perf_counter()
    done = subprocess.run(
        [str(CLI), "coverage", "--json"], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    return wall, json.loads(done.stdout)["rows"] if done.stdout.strip() else []


def benchmark_coverage(runs: int) -> dict[str, Any]:
    """``coverage`` ``runs`` times: its wall seconds, pairs and verified, the slowest trace."""
    walls, runs_rows = [], []
    for index in range(runs):
        wall, rows = time_coverage()
        walls.append(wall)
        runs_rows.append(rows)
        print(f"  coverage run {index + 1}: {wall:.0f} s", file=sys.stderr)
    rows = runs_rows[-1]
    per_pair: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run_rows in runs_rows:
        for r in run_rows:
            pair = per_pair.setdefault((r["model"], r["modality"]), {"trace_s": [], "seconds": []})
            pair["trace_s"].append(r["trace_s"])
            pair["seconds"].append(r["seconds"])
    pairs = [
        {"model": model, "modality": modality, "trace_s": spread(t["trace_s"]),
         "seconds": spread(t["seconds"])}
        for (model, modality), t in per_pair.items()
    ]  # fmt: skip
    slowest_trace = max(pairs, key=lambda p: p["trace_s"]["median"]) if pairs else None
    return {
        "runs": runs,
        "wall_s": spread(walls, digits=1),
        "pairs": len(rows),
        "verified": [sum(r["verified"] for r in run_rows) for run_rows in runs_rows],
        "slowest_trace": slowest_trace,
        "trace_s_max": spread(max((r["trace_s"] for r in rr), default=0.0) for rr in runs_rows),
        "pairs_at_or_over_target": max(
            sum(r["trace_s"] >= TRACE_TARGET_S for r in rr) for rr in runs_rows
        ),
        "median_pair_s": spread(
            statistics.median(r["seconds"] for r in rr) if rr else 0.0 for rr in runs_rows
        ),
        "slowest_whole": sorted(pairs, key=lambda p: -p["seconds"]["median"])[:5],
    }


def benchmark_commands(runs: int) -> dict[str, Any]:
    """The slow commands of before, each ``runs`` times in fresh processes, then ``coverage``
    ``runs`` times."""
    commands = []
    for label, arguments in COMMANDS:
        timed = [time_command(arguments) for _ in range(runs)]
        errors = [error for _, _, error in timed if error]
        traces = [trace for _, trace, _ in timed if trace is not None]
        commands.append(
            {
                "label": label,
                "arguments": arguments,
                "wall_s": spread((wall for wall, _, _ in timed), digits=2),
                "trace_s": spread(traces, digits=3) if traces else None,
                "error": errors[0] if errors else None,
            }
        )
        print(f"  {label}: {commands[-1]['wall_s']['median']:.2f} s", file=sys.stderr)
    return {"runs": runs, "commands": commands, "coverage": benchmark_coverage(runs)}


# ---------------------------------------------------------------- goals
def judge_trace(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each trace row at most as slow as llm-compressor's; attempt_trace on one core < 5 s."""
    goals = []
    for model in models:
        for row in model["rows"]:
            value = ratio(row)
            if row["label"].startswith("trace") and value is not None:
                goals.append(
                    goal(
                        f"{model['name']}, {row['label']}: llmc-trace / llm-compressor",
                        "≤ 1.0×",
                        f"{value:.2f}×",
                        value <= 1.0,
                    )
                )
            if row["label"].startswith("attempt") and row["ours"]["seconds"]:
                seconds = row["ours"]["seconds"]["median"]
                goals.append(
                    goal(
                        f"{model['name']}: attempt_trace, one core, {model['num_layers']} layers",
                        f"< {ONE_CORE_TARGET_S:.0f} s",
                        f"{seconds:.2f} s",
                        seconds < ONE_CORE_TARGET_S,
                    )
                )
    return goals


def judge_commands(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """trace_s under 1 s everywhere, Qwen2-VL image within 2x of text, --help and coverage."""
    walls = {c["label"]: c["wall_s"]["median"] for c in figures["commands"]}
    goals = []
    for command in figures["commands"]:
        if command["trace_s"] is not None:
            trace = command["trace_s"]["median"]
            goals.append(
                goal(
                    f"{command['label']}: trace_s",
                    f"< {TRACE_TARGET_S:.0f} s",
                    f"{trace:.2f} s",
                    trace < TRACE_TARGET_S,
                )
            )
    image_over_text = walls[IMAGE_ROW] / walls[TEXT_ROW]
    coverage = figures["coverage"]
    slowest = coverage["trace_s_max"]["max"]
    return [
        *goals,
        goal(
            "Qwen2-VL-2B with an image / with text, whole command (--fix)",
            f"≤ {IMAGE_OVER_TEXT_TARGET:.0f}×",
            f"{image_over_text:.2f}×",
            image_over_text <= IMAGE_OVER_TEXT_TARGET,
        ),
        goal("--help", f"< {HELP_TARGET_S:.0f} s", f"{walls['--help']:.2f} s",
             walls["--help"] < HELP_TARGET_S),
        goal("coverage, whole run", f"< {COVERAGE_TARGET_S / 60:.0f} min",
             f"{coverage['wall_s']['median']:.0f} s",
             coverage["wall_s"]["median"] < COVERAGE_TARGET_S),
        goal("coverage: every pair's trace_s", f"< {TRACE_TARGET_S:.0f} s",
             f"slowest {slowest:.2f} s", slowest < TRACE_TARGET_S),
    ]  # fmt: skip


# ---------------------------------------------------------------- tables
def seconds_cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "no venv"
    if not summary["seconds"]:
        return "failed"
    return spread_text(summary["seconds"], ".2f")


def memory_cell(summary: dict[str, Any] | None) -> str:
    if summary is None or not summary["seconds"]:
        return "-"
    delta = "?" if summary["trace_rss_mib"] is None else f"{summary['trace_rss_mib']:.0f}"
    return f"{summary['peak_rss_mib']:.0f} / {delta}"


def trace_tables(figures: dict[str, Any]) -> dict[str, str]:
    """``trace``: every measurement of every model; ``summary``: the 2nd call on all threads
    (the trace alone) and the whole attempt on one core, per model."""
    trace = [
        "| model | measurement | llmc-trace s | llm-compressor s | ours/theirs "
        "| RSS MiB ours (peak / call) | RSS MiB theirs (peak / call) |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = [
        "| model | layers | subgraphs (llmc-trace / llm-compressor) | trace s, llmc-trace "
        "| trace s, llm-compressor | ours/theirs | attempt_trace s, one core |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in figures["models"]:
        rows = {row["label"]: row for row in model["rows"]}
        for row in model["rows"]:
            value = ratio(row)
            trace.append(
                f"| {model['name']} | {row['label']} | {seconds_cell(row['ours'])} "
                f"| {seconds_cell(row['theirs'])} | {'-' if value is None else f'{value:.2f}×'} "
                f"| {memory_cell(row['ours'])} | {memory_cell(row['theirs'])} |"
            )
        second = rows["trace, 2nd call, all threads"]
        theirs_count = (second["theirs"] or {}).get("num_subgraphs")
        value = ratio(second)
        summary.append(
            f"| {model['name']} | {model['num_layers']} | {second['ours']['num_subgraphs']} / "
            f"{'-' if theirs_count is None else theirs_count} | {seconds_cell(second['ours'])} "
            f"| {seconds_cell(second['theirs'])} | {'-' if value is None else f'{value:.2f}×'} "
            f"| {seconds_cell(rows['attempt, 1st call, one core']['ours'])} |"
        )
    return {"trace": "\n".join(trace), "summary": "\n".join(summary)}


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row per model: the trace alone (2nd call, all threads), ours over
    llm-compressor's."""
    rows = []
    for model in result["figures"].get("models", []):
        second = {row["label"]: row for row in model["rows"]}["trace, 2nd call, all threads"]
        value = ratio(second)
        rows.append((
            f"Tracing {model['name']} on meta beside llm-compressor 0.14",
            f"{seconds_cell(second['ours'])} s"
            + ("" if value is None else f", {value:.2f}x its time"),
        ))
    return rows


def command_tables(figures: dict[str, Any]) -> dict[str, str]:
    """``commands``: each command's ``trace_s`` and whole wall seconds; ``coverage``: the whole
    ``llmc-trace coverage`` run."""
    commands = ["| command | trace s | whole command s |", "|---|---|---|"]
    for c in figures["commands"]:
        trace = spread_text(c["trace_s"], ".2f") if c["trace_s"] else ""
        wall = spread_text(c["wall_s"], ".2f" if c["wall_s"]["median"] < 1 else ".1f")
        wall = "failed" if c["error"] else wall
        commands.append(f"| `{c['arguments']}` | {trace} | {wall} |")
    cov = figures["coverage"]
    slowest = cov["slowest_trace"]
    verified = sorted(set(cov["verified"]))
    coverage = [
        "| (model, modality) pairs | verified | whole run s | median pair s "
        "| slowest trace s | pairs with trace s ≥ 1 |",
        "|---|---|---|---|---|---|",
        f"| {cov['pairs']} | {' / '.join(map(str, verified))} "
        f"| {spread_text(cov['wall_s'], '.0f')} "
        f"| {spread_text(cov['median_pair_s'], '.2f')} "
        f"| {spread_text(slowest['trace_s'], '.2f')} ({slowest['model']}, {slowest['modality']}) "
        f"| {cov['pairs_at_or_over_target']} |",
    ]
    return {"commands": "\n".join(commands), "coverage": "\n".join(coverage)}


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The tables of either part's result: ``trace`` and ``summary`` (``trace_speed.json``),
    ``commands`` and ``coverage`` (``trace_speed-commands.json``)."""
    figures = result["figures"]
    if "models" in figures:
        return trace_tables(figures)
    return command_tables(figures)


def print_errors(models: list[dict[str, Any]]) -> None:
    for model in models:
        for row in model["rows"]:
            for tool in ("ours", "theirs"):
                summary = row[tool]
                if summary is not None and summary["error"]:
                    name = "llmc-trace" if tool == "ours" else "llm-compressor"
                    print(f"  ! {model['name']}, {row['label']}, {name}: {summary['error']}")


# ---------------------------------------------------------------- main
def benchmark(models: list[str], runs: int, results_dir: Path | None) -> None:
    """The trace part: every model against llm-compressor, written to ``trace_speed.json``."""
    run = Run("trace_speed")
    reference = REFERENCE_PYTHON.exists()
    print(f"trace speed: median of {runs} fresh processes per cell (min–max in brackets)")
    if not reference:
        print(f"no llm-compressor venv at {REFERENCE_PYTHON}: run benchmarks/reference_env.sh")
    measured = []
    with tempfile.TemporaryDirectory(prefix="trace_speed_") as tmp:
        for name in models:
            case = prepare_case(name, Path(tmp))
            print(f"{case.name} ({case.num_layers} layers, {case.dtype}, targets {case.targets})")
            measured.append(measure_case(case, runs, reference))
    reported = [e for e in (m.pop("llmcompressor_environment") for m in measured) if e]
    environments = {"llm-compressor worker": reported[0]} if reported else {}
    figures = {"runs": runs, "seq_len": SEQ_LEN, "reference": reference, "models": measured}
    rendered = trace_tables(figures)
    print()
    print(rendered["trace"])
    print()
    print(rendered["summary"])
    print_errors(measured)
    goals = judge_trace(measured)
    for g in goals:
        print(f"  {g['goal']}: {g['figure']} {g['verdict']} the {g['target']} target")
    run.write(
        figures,
        goals=goals,
        environments=environments,
        notes=[
            "trace: llmc-trace's trace_graph + partition_trace, llm-compressor's "
            "trace_subgraphs; attempt: llmc-trace's whole attempt_trace (build, trace, "
            "partition, twin verification) against llm-compressor's one-core 1st-call "
            "trace_subgraphs (it has no verification step).",
            "RSS MiB: peak resident set of the whole process, imports included / peak growth "
            "during the first timed call. 2nd call: the same trace again in the same process, "
            "after one-time costs (lazy imports, first use of meta kernels).",
        ],
        path=results_dir / "trace_speed.json" if results_dir else None,
    )


def benchmark_whole_commands(runs: int, results_dir: Path | None) -> None:
    """The commands part, written to ``trace_speed-commands.json``."""
    run = Run("trace_speed-commands")
    print(f"whole commands: median of {runs} fresh processes (wall s; trace_s from --json)")
    figures = benchmark_commands(runs)
    rendered = command_tables(figures)
    print(rendered["commands"])
    print()
    print(rendered["coverage"])
    for c in figures["commands"]:
        if c["error"]:
            print(f"  ! {c['label']}: {c['error']}")
    goals = judge_commands(figures)
    for g in goals:
        print(f"  {g['goal']}: {g['figure']} {g['verdict']} the {g['target']} target")
    run.write(
        figures,
        goals=goals,
        path=results_dir / "trace_speed-commands.json" if results_dir else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help=f"model names (default: {' '.join(MODELS)})")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per measurement")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MODELS[0]}, one run each")
    parser.add_argument(
        "--part",
        choices=["all", "trace", "commands"],
        default="all",
        help="trace: full-size traces against llm-compressor; commands: whole commands, coverage",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        help="where the result files go (default: benchmarks/results/)",
    )
    # the child-process side: one measurement, printed as a RESULT line
    parser.add_argument("--measure", choices=["trace", "attempt"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--sample", help=argparse.SUPPRESS)
    parser.add_argument("--targets", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        result = measure_ours(args.measure, args.model, args.sample, args.targets)
        print("RESULT " + json.dumps(result), flush=True)
        return
    models = args.models or (QUICK_MODELS if args.quick else MODELS)
    runs = 1 if args.quick else args.runs
    if args.part in ("all", "trace"):
        benchmark(models, runs, args.results_dir)
    if args.part in ("all", "commands") and not args.quick:
        print()
        benchmark_whole_commands(runs, args.results_dir)


if __name__ == "__main__":
    main()
