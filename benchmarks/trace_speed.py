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
of the two tools alternate, so a busy CPU slows both alike; the load average is printed before
and after.

The second part times whole ``llmc-trace`` commands as a user runs them (fresh process, wall
clock) on the models that used to take seconds to minutes (vision-language models, which run a
vision tower the trace does not enter; 128-expert MoEs; a 71-head model whose twin did not
shrink), with ``trace_s`` as ``attempt --json`` reports it, then ``llmc-trace --help`` and the
whole ``llmc-trace coverage`` run. Targets: ``trace_s`` under 1 s for every row and every
coverage pair, coverage under 3 minutes, Qwen2-VL with an image (``--fix``) within 2x of the same
command with text, ``--help`` under 1 s. llm-compressor has no such commands (its tracer takes a
loaded model and a processed sample), so these rows are ours alone.

    python benchmarks/trace_speed.py                  # 5 runs per measurement, both parts
    python benchmarks/trace_speed.py --runs 9
    python benchmarks/trace_speed.py --part commands  # the commands and coverage only
    python benchmarks/trace_speed.py --quick          # Llama-3.1-8B, 1 run: a smoke test
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

from _rss import peak_rss_since_reset, reset_peak_rss

HERE = Path(__file__).resolve().parent
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

    from llmc_trace.attempt.run import attempt_trace
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


@dataclass(frozen=True)
class Summary:
    """One measurement over several processes: its seconds, and median memory figures."""

    seconds: list[float]
    peak_rss_bytes: int
    trace_rss_bytes: int | None
    num_subgraphs: int
    error: str | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


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


def summarize(results: list[dict] | None, key: str) -> Summary | None:
    """The ``key`` seconds (``first_s`` or ``second_s``) of several processes' results."""
    if results is None:
        return None
    errors = [r["error"] for r in results if "error" in r]
    good = [r for r in results if key in r]
    if not good:
        return Summary([], 0, None, 0, errors[0] if errors else "no result")
    deltas = [r["trace_rss_bytes"] for r in good if "trace_rss_bytes" in r]
    return Summary(
        seconds=[r[key] for r in good],
        peak_rss_bytes=int(statistics.median(r["peak_rss_bytes"] for r in good)),
        trace_rss_bytes=int(statistics.median(deltas)) if deltas else None,
        num_subgraphs=good[0]["num_subgraphs"],
        error=errors[0] if errors else None,
    )


# ---------------------------------------------------------------- printing
def seconds_cell(summary: Summary | None) -> str:
    if summary is None:
        return "no venv"
    if not summary.seconds:
        return "failed"
    low, high = min(summary.seconds), max(summary.seconds)
    return f"{summary.median_s:6.2f} ({low:.2f}–{high:.2f})"


def memory_cell(summary: Summary | None) -> str:
    if summary is None or not summary.seconds:
        return "-"
    delta = "?" if summary.trace_rss_bytes is None else f"{summary.trace_rss_bytes / MiB:.0f}"
    return f"{summary.peak_rss_bytes / MiB:5.0f} / {delta}"


def ratio(ours: Summary, theirs: Summary | None) -> float | None:
    if theirs is None or not theirs.seconds or not ours.seconds:
        return None
    return ours.median_s / theirs.median_s


def print_header(runs: int, reference: bool) -> None:
    print(f"trace speed: median of {runs} fresh processes per cell (min–max in brackets)")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if not reference:
        print(f"no llm-compressor venv at {REFERENCE_PYTHON}: run benchmarks/reference_env.sh")
    print()
    print(
        f"  {'measurement':<30}{'llmc-trace s':>20}{'llm-compressor s':>20}{'ours/theirs':>12}"
        f"{'RSS MiB ours':>15}{'RSS MiB theirs':>16}"
    )


def print_row(label: str, ours: Summary, theirs: Summary | None) -> None:
    value = ratio(ours, theirs)
    print(
        f"  {label:<30}{seconds_cell(ours):>20}{seconds_cell(theirs):>20}"
        f"{'-' if value is None else f'{value:.2f}×':>12}"
        f"{memory_cell(ours):>15}{memory_cell(theirs):>16}"
    )
    for tool, summary in (("llmc-trace", ours), ("llm-compressor", theirs)):
        if summary is not None and summary.error:
            print(f"    ! {tool}: {summary.error}")


Row = tuple[ModelCase, str, Summary, "Summary | None"]


def print_footer(rows: list[Row]) -> None:
    print()
    print("trace: llmc-trace's trace_graph + partition_trace, llm-compressor's trace_subgraphs.")
    print("attempt: llmc-trace's attempt_trace (build, trace, partition, twin verify) against")
    print("llm-compressor's one-core 1st-call trace_subgraphs (it has no verification step).")
    print("RSS MiB: peak resident set of the whole process, imports included (ru_maxrss) /")
    print("peak growth during the first timed call. 2nd call: the same trace again in the same")
    print("process, after one-time costs (lazy imports, first use of meta kernels).")
    for case, label, ours, theirs in rows:
        if label.startswith("trace, 1st call, all"):
            counts = f"{ours.num_subgraphs} subgraphs (llmc-trace)"
            if theirs is not None and theirs.seconds:
                counts += f", {theirs.num_subgraphs} (llm-compressor)"
                if theirs.num_subgraphs != ours.num_subgraphs:
                    counts += ": the tools did not trace the same partition"
            print(f"  {case.name}: {counts}")
    for case, label, ours, theirs in rows:
        value = ratio(ours, theirs)
        if label.startswith("trace") and value is not None:
            verdict = "meets" if value <= 1.0 else "MISSES"
            print(f"  {case.name}, {label}: {value:.2f}× {verdict} the ≤ 1.0× target")
        if label.startswith("attempt") and ours.seconds:
            verdict = "meets" if ours.median_s < ONE_CORE_TARGET_S else "MISSES"
            print(
                f"  {case.name}, attempt_trace on one core: {ours.median_s:.2f} s for "
                f"{case.num_layers} layers {verdict} the < {ONE_CORE_TARGET_S:.0f} s target"
            )
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


def stage_medians(results: list[dict]) -> str:
    """``attempt_trace``'s own timings (median seconds per stage) over several processes."""
    stages = [r["stages_s"] for r in results if "stages_s" in r]
    if not stages:
        return ""
    names = list(stages[0])
    return ", ".join(
        f"{name.removesuffix('_s')} {statistics.median(s.get(name, 0.0) for s in stages):.2f}"
        for name in names
    )


def measure_case(case: ModelCase, runs: int, reference: bool) -> tuple[list[Row], str]:
    """Every row of one model (trace on all threads and on one core, attempt on one core), and
    the attempt's stages."""
    rows: list[Row] = []
    theirs_one_core: list[dict] | None = None
    for cores, one_core in (("all threads", False), ("one core", True)):
        threads = 1 if one_core else 0
        theirs_command = reference_command(case, threads) if reference else None
        ours, theirs = run_alternating(
            ours_command(case, "trace", threads), theirs_command, one_core, runs
        )
        for call, key in (("1st call", "first_s"), ("2nd call", "second_s")):
            label = f"trace, {call}, {cores}"
            rows.append((case, label, summarize(ours, key), summarize(theirs, key)))
        if one_core:
            theirs_one_core = theirs
    # llm-compressor has no attempt (no verification): compare with its one-core first trace
    attempt, _ = run_alternating(ours_command(case, "attempt", 1), None, True, runs)
    rows.append(
        (
            case,
            "attempt, 1st call, one core",
            summarize(attempt, "first_s"),
            summarize(theirs_one_core, "first_s"),
        )
    )
    return rows, stage_medians(attempt)


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


def benchmark_commands(runs: int) -> None:
    """The slow commands of before, each ``runs`` times in fresh processes, then ``coverage``."""
    print(f"whole commands: median of {runs} fresh processes (wall s; trace_s from --json)")
    print(f"  {'command':<30}{'wall s':>10}{'trace_s':>10}")
    walls: dict[str, float] = {}
    verdicts = []
    for label, arguments in COMMANDS:
        timed = [time_command(arguments) for _ in range(runs)]
        errors = [error for _, _, error in timed if error]
        walls[label] = statistics.median(wall for wall, _, _ in timed)
        traces = [trace for _, trace, _ in timed if trace is not None]
        trace = statistics.median(traces) if traces else None
        cell = "-" if trace is None else f"{trace:.3f}"
        print(f"  {label:<30}{walls[label]:>10.2f}{cell:>10}")
        if errors:
            print(f"    ! {errors[0]}")
        if trace is not None and trace >= TRACE_TARGET_S:
            verdicts.append(
                f"{label}: trace_s {trace:.2f} MISSES the < {TRACE_TARGET_S:.0f} s target"
            )
    ratio_image = walls[IMAGE_ROW] / walls[TEXT_ROW]
    verdicts.append(
        f"Qwen2-VL image/text wall (--fix): {ratio_image:.2f}x "
        f"{'meets' if ratio_image <= IMAGE_OVER_TEXT_TARGET else 'MISSES'} the "
        f"<= {IMAGE_OVER_TEXT_TARGET:.0f}x target"
    )
    verdicts.append(
        f"--help: {walls['--help']:.2f} s "
        f"{'meets' if walls['--help'] < HELP_TARGET_S else 'MISSES'} the < 1 s target"
    )
    start = time.perf_counter()
    done = subprocess.run(
        [str(CLI), "coverage", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    coverage_s = time.perf_counter() - start
    rows = json.loads(done.stdout)["rows"] if done.stdout.strip() else []
    slowest = max(rows, key=lambda r: r["trace_s"]) if rows else None
    print()
    print(
        f"coverage: {len(rows)} (model, modality) pairs, {sum(r['verified'] for r in rows)} "
        f"verified, {coverage_s:.0f} s wall "
        f"({'meets' if coverage_s < COVERAGE_TARGET_S else 'MISSES'} the < 3 min target)"
    )
    if slowest is not None:
        over = [r for r in rows if r["trace_s"] >= TRACE_TARGET_S]
        print(
            f"  slowest trace_s: {slowest['trace_s']:.2f} s ({slowest['model']}, "
            f"{slowest['modality']}); {len(over)} pairs at or above {TRACE_TARGET_S:.0f} s; "
            f"median pair {statistics.median(r['seconds'] for r in rows):.2f} s whole attempt"
        )
        for row in sorted(rows, key=lambda r: -r["seconds"])[:5]:
            print(
                f"  {row['seconds']:6.2f} s whole, trace_s {row['trace_s']:.2f}: "
                f"{row['model']} · {row['modality']}"
            )
    for verdict in verdicts:
        print(f"  {verdict}")


# ---------------------------------------------------------------- main
def benchmark(models: list[str], runs: int) -> None:
    reference = REFERENCE_PYTHON.exists()
    print_header(runs, reference)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="trace_speed_") as tmp:
        for name in models:
            case = prepare_case(name, Path(tmp))
            print(f"{case.name} ({case.num_layers} layers, {case.dtype}, targets {case.targets})")
            case_rows, stages = measure_case(case, runs, reference)
            for _, label, ours, theirs in case_rows:
                print_row(label, ours, theirs)
            print(f"    attempt stages, median s: {stages}")
            rows += case_rows
    print_footer(rows)


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
        benchmark(models, runs)
    if args.part in ("all", "commands") and not args.quick:
        print()
        benchmark_commands(runs)


if __name__ == "__main__":
    main()
