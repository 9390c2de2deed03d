"""Peak memory of each calibration pipeline, measured against the memory plan's estimate.

Part 1 runs ``basic``, ``layer_sequential`` and ``sequential`` on a 16-layer Llama of tiny
width (hidden 512, MLP 1536, 8 heads, vocabulary 4096; float32, eager attention, seeded random
weights) over 256 samples of 64 tokens (batch size 1), with ``LayerCompressor("gptq",
W4A16)`` listening: real GPTQ, so the compressor's whole state is there (Hessians shared by
q/k/v and by gate/up, GPTQ's working tensors, the quantized weights it keeps for the
checkpoint). Each pipeline runs in a fresh process. Its peak is CUDA's
``max_memory_allocated`` when a GPU is present, else the peak resident set (kernel VmHWM, reset
just before the pipeline) minus the resident set right before the pipeline starts: weights,
batches and the traced subgraphs are already resident then and are not counted, nor is the
library code the kernels page in as they first run (``_rss.library_code_bytes``).

The estimate comes from ``plan_source`` on the meta trace with the same settings. On a GPU,
the measured peak is compared with ``device_bytes``. On a CPU it is compared with the plan of
a CPU run (device and host one memory, as ``compress`` plans one): its ``host_bytes`` less the
weights, which were resident before the pipeline. The target is an estimate within 25 % of
the measurement.

Part 2 runs ``sequential`` (with callbacks that change nothing) on an 80-layer Llama of tiny
width over 64 samples and reports the intermediates cache: which values it stores once for all
samples (``shared_names``: causal mask, rotary cos/sin, ...) and its peak bytes, against the
bytes if every sample kept its own copy of those values, and the resident growth sampled in
the first subgraphs, the others and the last.

The run writes ``benchmarks/results/pipeline_memory.json`` (``--result`` elsewhere): the
settings, the plan's estimates, every worker's measurements and the goals' verdicts (each
pipeline within 25 %; on a GPU, the device ratio). ``tables`` renders the printed tables
(``estimates``, ``stages``, ``compressor``, ``cache``, ``shared``, ``cache_growth``) from that
file alone, as ``benchmarks/tables.py`` does for the docs. Each pipeline runs once: its peak is
a memory figure, and its seconds are recorded but shown in no table.

    python benchmarks/pipeline_memory.py            # 2-5 minutes on 2 cores
    python benchmarks/pipeline_memory.py --quick    # 4 layers, 16 samples: a smoke test
    python benchmarks/pipeline_memory.py --jobs 1   # one pipeline process at a time

Pipeline processes use one torch thread each and run ``--jobs`` at a time (default: one per
CPU): on a CPU shared with other work, one thread per process is far faster than several
threads waiting on each other, and memory is per process either way.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from _results import Run, goal
from _rss import library_code_bytes, peak_rss_since_reset, reset_peak_rss, resident_bytes

MiB = 1024 * 1024
PIPELINES = ("basic", "layer_sequential", "sequential")
TOLERANCE = 0.25  # the estimate should be within 25 % of the measured peak
DEVICE_RATIO_TARGET = 0.25  # sequential's device peak under a quarter of basic's
#: glibc serves allocations above this size with mmap and unmaps them on free. Fixing it stops
#: glibc's default of raising the threshold up to 32 MiB, so the tiny model's tensors, like a
#: full-size model's (mostly above 32 MiB), leave the resident set when freed, and the peak
#: resident set measures live data rather than heap fragmentation.
MMAP_THRESHOLD = 128 * 1024


@dataclass(frozen=True)
class Workload:
    """A tiny-width Llama and the calibration data it runs on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    samples: int
    seq_len: int

    def describe(self) -> str:
        return (
            f"Llama, {self.layers} layers, hidden {self.hidden}, MLP {self.intermediate}, "
            f"{self.heads} heads, vocabulary {self.vocab}, float32; "
            f"{self.samples} samples × {self.seq_len} tokens, batch size 1"
        )


PIPELINE_WORKLOAD = Workload(16, 512, 1536, 8, 4096, samples=256, seq_len=64)
CACHE_WORKLOAD = Workload(80, 128, 256, 4, 1024, samples=64, seq_len=256)
QUICK_PIPELINE_WORKLOAD = Workload(4, 512, 1536, 8, 4096, samples=16, seq_len=64)
QUICK_CACHE_WORKLOAD = Workload(80, 128, 256, 4, 1024, samples=8, seq_len=64)


def write_config(workload: Workload, folder: Path) -> Path:
    """A config folder for ``workload``'s model, usable as a model name by llmc-trace."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=workload.hidden,
        intermediate_size=workload.intermediate,
        num_attention_heads=workload.heads,
        num_key_value_heads=workload.heads,
        num_hidden_layers=workload.layers,
        vocab_size=workload.vocab,
        max_position_embeddings=max(2048, workload.seq_len),
        tie_word_embeddings=False,
        use_cache=False,
        architectures=["LlamaForCausalLM"],
        dtype="float32",
    )
    config.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- measuring (child process)
class PeakMemory:
    """Peak bytes allocated inside the ``with`` block above what was allocated at its start.

    CUDA: ``max_memory_allocated``. CPU: the kernel's resident high-water mark (VmHWM), which
    writing ``5`` to ``/proc/self/clear_refs`` resets to the current resident set. Freed memory
    is first handed back to the kernel (``malloc_trim``), so the baseline holds live data only,
    and the library code the block's kernels page in as they first run (``code_bytes``, see
    ``_rss.library_code_bytes``) is no part of the peak: it is the libraries', not the data's.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.peak_bytes = 0
        self.code_bytes = 0
        self.stage_bytes: dict[str, int] = {}

    def current_bytes(self) -> int:
        import torch

        if self.device.type == "cuda":
            return torch.cuda.memory_allocated() - self.start_bytes
        return resident_bytes() - self.start_bytes

    def sample(self, stage: str, done: int, total: int) -> None:
        """A pipeline's progress callback: the most allocated at a batch boundary, per stage."""
        self.stage_bytes[stage] = max(self.stage_bytes.get(stage, 0), self.current_bytes())

    def __enter__(self) -> PeakMemory:
        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_bytes = torch.cuda.memory_allocated()
        else:
            self.start_bytes = reset_peak_rss()
            self.start_code = library_code_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self.start_bytes
        else:
            self.code_bytes = library_code_bytes() - self.start_code
            self.peak_bytes = peak_rss_since_reset() - self.start_bytes - self.code_bytes


def build_model(config_dir: str) -> Any:
    """The model of the config folder with seeded random weights, float32, eager attention."""
    import torch

    from llmc_trace.models.build import model_class, prepare_config
    from llmc_trace.models.source import resolve_model

    source = resolve_model(config_dir)
    config = prepare_config(source.config())
    torch.manual_seed(0)
    model = model_class(config, source.name)._from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


def make_batches(model: Any, samples: int, seq_len: int) -> list[dict[str, Any]]:
    from llmc_trace.models.samples import SampleOptions, make_sample

    return [
        make_sample(model.config, "text", SampleOptions(seq_len=seq_len, seed=seed))
        for seed in range(samples)
    ]


def kept_bytes(compressor: Any) -> int:
    """Bytes of the quantized weights the compressor keeps for the checkpoint."""
    total = 0
    for quantized in compressor.quantized.values():
        for tensor in (quantized.int_weight, quantized.scale, quantized.zero_point):
            total += tensor.numel() * tensor.element_size()
    return total


def unique_hessian_bytes(model: Any, compressor: Any, layer: str) -> int:
    """Bytes of the Hessians ``layer``'s Linears used (a shared Hessian counted once)."""
    return sum(
        4 * model.get_submodule(r.name).in_features ** 2
        for r in compressor.results
        if r.name.startswith(layer + ".") and r.shares_hessian_with is None
    )


def gptq_working_bytes(model: Any) -> dict:
    """Peak bytes of one GPTQ call on the model's Linear with the widest input, its H given up
    (as the compressor gives a Hessian up to its last Linear)."""
    import torch

    from llmc_trace.algorithms.gptq import gptq
    from llmc_trace.algorithms.hessian import HessianAccumulator
    from llmc_trace.algorithms.scheme import resolve_scheme

    name, linear = max(
        ((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)),
        key=lambda item: (item[1].in_features, item[1].out_features),
    )
    accumulator = HessianAccumulator(linear.in_features)
    accumulator.add(torch.randn(4 * linear.in_features, linear.in_features))
    weight = linear.weight.detach().clone()
    with PeakMemory(weight.device) as peak:
        gptq(weight, accumulator.H, resolve_scheme("W4A16").weights, overwrite_hessian=True)
    return {"name": name, "shape": list(weight.shape), "peak_bytes": peak.peak_bytes}


def measure_pipeline(pipeline: str, config_dir: str, samples: int, seq_len: int) -> dict:
    """Run ``pipeline`` once with GPTQ listening; its peak memory and what was kept."""
    import torch

    from llmc_trace.algorithms.scheme import resolve_scheme
    from llmc_trace.calibrate.compressor import LayerCompressor
    from llmc_trace.graph.partition import partition_trace
    from llmc_trace.pipelines.basic import run_basic
    from llmc_trace.pipelines.layer_sequential import run_layer_sequential
    from llmc_trace.pipelines.sequential import run_sequential
    from llmc_trace.pipelines.estimate import RunSettings
    from llmc_trace.plan.estimate import compressor_costs
    from llmc_trace.tracing.trace import concrete_arguments, trace_graph

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(config_dir)
    batches = make_batches(model, samples, seq_len)
    compressor = LayerCompressor("gptq", resolve_scheme("W4A16"))
    trace = trace_graph(model, batches[0])  # as oneshot does, before the pipeline starts
    targets = [model.get_submodule(p) for p in trace.leaves.targets]
    subgraphs = partition_trace(trace).subgraphs
    forward_kwargs = concrete_arguments(model, batches[0])
    start = time.perf_counter()
    with PeakMemory(device) as peak:
        if pipeline in ("basic", "layer_sequential"):
            run = run_basic if pipeline == "basic" else run_layer_sequential
            stats = run(
                model,
                targets,
                batches,
                compressor,
                device=device,
                forward_kwargs=forward_kwargs,
                progress=peak.sample,
            )
        else:
            stats = run_sequential(
                model, subgraphs, batches, compressor, device=device, progress=peak.sample
            )
    return {
        "pipeline": pipeline,
        "device": device.type,
        "peak_bytes": peak.peak_bytes,
        "code_bytes": peak.code_bytes,
        "stage_bytes": peak.stage_bytes,
        "elapsed_s": time.perf_counter() - start,
        "layers_compressed": len(compressor.results),
        "kept_bytes": kept_bytes(compressor),
        "hessian_bytes_per_layer": unique_hessian_bytes(model, compressor, trace.leaves.targets[0]),
        "estimated_hessian_bytes_per_layer": compressor_costs(
            model, partition_trace(trace), RunSettings(samples, seq_len, dtype_bytes=4)
        )[0].hessian_bytes,
        "peak_cache_bytes": stats.peak_cache_bytes,
        "gptq_working": gptq_working_bytes(model) if pipeline == "basic" else None,
    }


class ListenOnly:
    """Callbacks that want every subgraph and change nothing: every subgraph runs, as in a real
    run, and the cache is all there is to measure."""

    def wants(self, modules: Any) -> bool:
        return True

    def passes(self, modules: Any) -> list[Any]:
        return [modules]

    def on_subgraph_start(self, index: int, modules: Any) -> None:
        return None

    def on_batch(self, batch: Any) -> None:
        return None

    def on_calibrated(self, index: int, modules: Any) -> None:
        return None

    def on_subgraph_end(self, index: int, modules: Any) -> None:
        return None


def measure_cache(config_dir: str, samples: int, seq_len: int) -> dict:
    """Run ``sequential`` with callbacks that change nothing; the cache's shared names and peak
    bytes."""
    import torch

    from llmc_trace.graph.partition import partition_trace
    from llmc_trace.core.sizes import value_bytes
    from llmc_trace.pipelines.sequential import run_sequential
    from llmc_trace.tracing.trace import trace_graph

    device = torch.device("cpu")
    model = build_model(config_dir)
    batches = make_batches(model, samples, seq_len)
    trace = trace_graph(model, batches[0])  # traced at the run's shape: values are per sample
    subgraphs = partition_trace(trace).subgraphs
    start = time.perf_counter()
    with PeakMemory(device) as peak:
        stats = run_sequential(
            model, subgraphs, batches, ListenOnly(), device=device, progress=peak.sample
        )
    values = {node.name: node.meta.get("val") for node in trace.graph.nodes}
    return {
        "peak_bytes": peak.peak_bytes,
        "elapsed_s": time.perf_counter() - start,
        "shared_names": stats.shared_names,
        "shared_bytes": {name: value_bytes(values.get(name)) for name in stats.shared_names},
        "peak_cache_bytes": stats.peak_cache_bytes,
        "num_subgraphs": len(subgraphs),
        "stage_bytes": peak.stage_bytes,
    }


# ---------------------------------------------------------------- estimating (parent)
@dataclass(frozen=True)
class Estimate:
    """The plan's figures for one pipeline, and what it says will be resident beyond the
    weights when the run is on a CPU (``one_memory_bytes``: the plan of a CPU run, where the
    device and the host are one memory, less the weights, which were resident before)."""

    pipeline: str
    device_bytes: int
    host_bytes: int
    cache_bytes: int
    weight_bytes: int
    one_memory_bytes: int


def plan_estimates(config_dir: Path, workload: Workload) -> tuple[str, dict[str, Estimate]]:
    """The plan's choice and its estimates, for a GPU run and for a CPU run."""
    from llmc_trace.core.sizes import parameter_bytes
    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.source import resolve_model
    from llmc_trace.plan import RunSettings, plan_source

    # the model's dtype (float32) for storage and compute, as plan_source reads it
    gpu = RunSettings(workload.samples, workload.seq_len, batch_size=1)
    cpu = replace(gpu, device_is_host=True)
    plans = plan_source(str(config_dir), [gpu, cpu], device_memory=2**50, host_memory=2**50)
    on_gpu, on_cpu = ({e.pipeline: e for e in plan.estimates} for plan in plans)
    weights = parameter_bytes(list(build_meta_model(resolve_model(str(config_dir))).modules()), 4)
    estimates = {
        name: Estimate(
            name,
            e.device_bytes,
            e.host_bytes,
            e.cache_bytes,
            weights,
            on_cpu[name].host_bytes - weights,
        )
        for name, e in on_gpu.items()
        if name in PIPELINES
    }
    return plans[1].chosen, estimates


# ---------------------------------------------------------------- orchestrating (parent)
def run_child(arguments: list[str]) -> dict:
    """Run one measurement in a fresh process (one torch thread) and parse its RESULT line."""
    command = [sys.executable, str(Path(__file__).resolve()), *arguments, "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(
        f"{' '.join(arguments)} failed (exit code {done.returncode}):\n{done.stderr[-3000:]}"
    )


def measure_all(config_dir: Path, cache_dir: Path, workload: Workload, cache: Workload, jobs: int):  # type: ignore[no-untyped-def]
    pipeline_args = [
        [
            "--measure",
            p,
            "--config",
            str(config_dir),
            "--samples",
            str(workload.samples),
            "--seq-len",
            str(workload.seq_len),
        ]
        for p in PIPELINES
    ]
    cache_args = [
        "--measure",
        "cache",
        "--config",
        str(cache_dir),
        "--samples",
        str(cache.samples),
        "--seq-len",
        str(cache.seq_len),
    ]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        # the longest first, so the pool ends together
        futures = [
            pool.submit(run_child, a)
            for a in [pipeline_args[2], pipeline_args[1], pipeline_args[0], cache_args]
        ]
        sequential, layer_sequential, basic, cache_result = (f.result() for f in futures)
    return {
        "basic": basic,
        "layer_sequential": layer_sequential,
        "sequential": sequential,
    }, cache_result


# ---------------------------------------------------------------- figures (parent)
def estimate_figures(estimate: Estimate, on_gpu: bool) -> dict[str, Any]:
    """The plan's figures for one pipeline and the one it is judged by: ``device_bytes`` on a
    GPU, the one-memory figure on a CPU."""
    return {
        "device_bytes": estimate.device_bytes,
        "host_bytes": estimate.host_bytes,
        "cache_bytes": estimate.cache_bytes,
        "weight_bytes": estimate.weight_bytes,
        "compared_bytes": estimate.device_bytes if on_gpu else estimate.one_memory_bytes,
    }


def solver_figure(measured: dict[str, dict]) -> int:
    """The plan's ``solver_bytes`` for the Linear whose GPTQ call basic's worker measured."""
    import torch

    from llmc_trace.plan.estimate import solver_bytes

    out_features, in_features = measured["basic"]["gptq_working"]["shape"]
    return solver_bytes(torch.nn.Linear(in_features, out_features, device="meta"))


def judge(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Each pipeline's estimate within ``TOLERANCE`` of its measured peak; on a GPU, also
    sequential's device peak under ``DEVICE_RATIO_TARGET`` of basic's."""
    goals = []
    for name in PIPELINES:
        compared = figures["estimates"][name]["compared_bytes"]
        ratio = compared / figures["measured"][name]["peak_bytes"]
        goals.append(
            goal(
                f"{name}: estimate / measured peak",
                f"within {TOLERANCE:.0%}",
                f"{ratio:.2f}x",
                abs(ratio - 1) <= TOLERANCE,
            )
        )
    if figures["on_gpu"]:
        measured = figures["measured"]
        ratio = measured["sequential"]["peak_bytes"] / measured["basic"]["peak_bytes"]
        goals.append(
            goal(
                "sequential's device peak / basic's",
                f"< {DEVICE_RATIO_TARGET}",
                f"{ratio:.2f}",
                ratio < DEVICE_RATIO_TARGET,
            )
        )
    return goals


def run_notes(figures: dict[str, Any]) -> list[str]:
    """What ran, what is measured and compared, and the device ratio a CPU cannot measure."""
    workload = Workload(**figures["settings"]["pipelines"])
    cache = Workload(**figures["settings"]["cache"])
    estimates = figures["estimates"]
    notes = [
        f"Pipelines with GPTQ W4A16 (LayerCompressor) on a {workload.describe()}; "
        f"the plan chooses {figures['chosen']}. Each pipeline ran once, in a fresh process.",
    ]
    if figures["on_gpu"]:
        notes.append("Measured: CUDA max_memory_allocated during the pipeline; compared: the "
                     "plan's device_bytes.")  # fmt: skip
    else:
        notes.append(
            "Measured: peak RSS of a fresh process minus its RSS right before the pipeline. "
            "Compared: the host_bytes of the plan for a CPU run (device and host one memory) "
            "minus the weights, which were resident before."
        )
        estimated = estimates["sequential"]["device_bytes"] / estimates["basic"]["device_bytes"]
        notes.append(
            f"Sequential's device peak / basic's: estimated {estimated:.2f} (target < "
            f"{DEVICE_RATIO_TARGET}); not measured, a CPU has no separate device peak."
        )
    notes.append(f"Sequential's intermediates cache on a {cache.describe()}, callbacks that "
                 "change nothing.")  # fmt: skip
    return notes


# ---------------------------------------------------------------- tables (from the result)
def mib(value: float) -> str:
    return f"{value / MiB:.1f}"


def estimates_table(figures: dict[str, Any]) -> str:
    """Per pipeline: the plan's estimates, the figure compared, the measured peak, the ratio."""
    lines = [
        "| pipeline | device estimate MiB | host estimate MiB | cache estimate MiB "
        "| estimate compared MiB | measured peak MiB | estimate / measured "
        f"| within {TOLERANCE:.0%} |",
        "|---" * 8 + "|",
    ]
    for name in PIPELINES:
        estimate, measured = figures["estimates"][name], figures["measured"][name]
        ratio = estimate["compared_bytes"] / measured["peak_bytes"]
        chosen = " (the plan's choice)" if name == figures["chosen"] else ""
        lines.append(
            f"| {name}{chosen} | {mib(estimate['device_bytes'])} | {mib(estimate['host_bytes'])} "
            f"| {mib(estimate['cache_bytes'])} | {mib(estimate['compared_bytes'])} "
            f"| {mib(measured['peak_bytes'])} | {ratio:.2f}x "
            f"| {'yes' if abs(ratio - 1) <= TOLERANCE else 'no'} |"
        )
    return "\n".join(lines)


def stages_table(figures: dict[str, Any]) -> str:
    """Where each pipeline holds the most, sampled at batch boundaries (GPTQ runs between)."""
    lines = ["| pipeline | highest (MiB) | next (MiB) | lowest (MiB) |", "|---|---|---|---|"]
    for name in PIPELINES:
        stages = sorted(figures["measured"][name]["stage_bytes"].items(), key=lambda i: -i[1])
        cells = [f"{label} {mib(value)}" for label, value in stages[:2]]
        cells += ["-"] * (2 - len(cells))
        cells.append(f"{stages[-1][0]} {mib(stages[-1][1])}" if len(stages) > 2 else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compressor_table(figures: dict[str, Any]) -> str:
    """The compressor state behind the measured peaks, from the workers' own accounting,
    beside what the plan counts for it."""
    basic, sequential = figures["measured"]["basic"], figures["measured"]["sequential"]
    gptq = basic["gptq_working"]
    out_features, in_features = gptq["shape"]
    rows = [
        (
            "Hessians of one decoder layer (q/k/v and gate/up share one each)",
            basic["hessian_bytes_per_layer"],
            basic["estimated_hessian_bytes_per_layer"],
        ),
        (
            f"one GPTQ call on {gptq['name']} ({out_features}×{in_features}), working memory",
            gptq["peak_bytes"],
            figures["solver_bytes"],
        ),
        (
            f"quantized weights kept until the checkpoint ({basic['layers_compressed']} Linears)",
            basic["kept_bytes"],
            None,
        ),
        (
            "sequential's cache at its peak (at subgraph boundaries)",
            sequential["peak_cache_bytes"],
            figures["estimates"]["sequential"]["cache_bytes"],
        ),
    ]
    lines = ["| compressor state | measured MiB | the plan counts MiB |", "|---|---|---|"]
    for label, measured, estimated in rows:
        counted = "-" if estimated is None else mib(estimated)
        lines.append(f"| {label} | {mib(measured)} | {counted} |")
    return "\n".join(lines)


def cache_table(figures: dict[str, Any]) -> str:
    """Part 2: the cache's peak against the plan and against one copy per sample, and the
    whole run's resident growth."""
    result, samples = figures["cache"], figures["settings"]["cache"]["samples"]
    per_sample = sum(result["shared_bytes"].values())
    copies = result["peak_cache_bytes"] + (samples - 1) * per_sample
    rows = [
        ("peak cache bytes (PipelineStats)", result["peak_cache_bytes"]),
        ("the plan's estimate of the cache", result["estimated_cache_bytes"]),
        (
            f"if each sample kept its own copy (+{samples - 1} × {per_sample / 1024:.1f} KiB)",
            copies,
        ),
        ("peak RSS growth of the whole run", result["peak_bytes"]),
    ]
    lines = ["| intermediates cache | MiB |", "|---|---|"]
    lines += [f"| {label} | {mib(value)} |" for label, value in rows]
    return "\n".join(lines)


def shared_table(figures: dict[str, Any]) -> str:
    """The values sequential's cache stores once for all samples (``shared_names``)."""
    shared = figures["cache"]["shared_bytes"]
    lines = ["| stored once for all samples | KiB per sample |", "|---|---|"]
    names = figures["cache"]["shared_names"]
    lines += [f"| `{name}` | {shared[name] / 1024:.1f} |" for name in names]
    return "\n".join(lines)


def cache_growth_table(figures: dict[str, Any]) -> str:
    """Resident growth sampled at batch boundaries: the first subgraphs, the median of the
    ones in between, the last."""
    stages = list(figures["cache"]["stage_bytes"].items())  # in run order
    middle = sorted(value for _, value in stages[2:-1])
    rows = list(stages[:2])
    if middle:
        rows.append(("median of the subgraphs in between", middle[len(middle) // 2]))
    rows.append(stages[-1])
    lines = ["| sampled at | growth MiB |", "|---|---|"]
    lines += [f"| {label} | {mib(value)} |" for label, value in rows]
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """This benchmark's tables from its result alone: ``estimates`` (each pipeline's estimate
    against its measured peak), ``stages``, ``compressor`` (the state behind the peaks), and
    for the intermediates cache ``cache``, ``shared`` and ``cache_growth``."""
    figures = result["figures"]
    return {
        "estimates": estimates_table(figures),
        "stages": stages_table(figures),
        "compressor": compressor_table(figures),
        "cache": cache_table(figures),
        "shared": shared_table(figures),
        "cache_growth": cache_growth_table(figures),
    }


def print_tables(figures: dict[str, Any], goals: list[dict[str, Any]], notes: list[str]) -> None:
    for note in notes:
        print(note)
    for key, table in tables({"figures": figures}).items():
        print(f"\n{key}:\n{table}")
    print()
    for g in goals:
        print(f"{g['goal']}: {g['figure']} (target {g['target']}): {g['verdict']}")
    seconds = ", ".join(f"{p} {figures['measured'][p]['elapsed_s']:.0f}" for p in PIPELINES)
    print(f"seconds per pipeline (one run each): {seconds}; cache "
          f"{figures['cache']['elapsed_s']:.0f}")  # fmt: skip


# ---------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 layers, 16 samples: smoke test")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="measurement processes at a time (default: one per CPU)",
    )
    parser.add_argument("--result", type=Path, help="where to write the result file")
    # the child-process side: one measurement, printed as a RESULT line
    parser.add_argument("--measure", choices=[*PIPELINES, "cache"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        if args.measure == "cache":
            result = measure_cache(args.config, args.samples, args.seq_len)
        else:
            result = measure_pipeline(args.measure, args.config, args.samples, args.seq_len)
        print("RESULT " + json.dumps(result), flush=True)
        return

    record = Run("pipeline_memory")
    workload = QUICK_PIPELINE_WORKLOAD if args.quick else PIPELINE_WORKLOAD
    cache = QUICK_CACHE_WORKLOAD if args.quick else CACHE_WORKLOAD
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeline_memory_") as tmp:
        config_dir = write_config(workload, Path(tmp) / "pipelines")
        cache_dir = write_config(cache, Path(tmp) / "cache")
        chosen, estimates = plan_estimates(config_dir, workload)
        cache_estimate = plan_estimates(cache_dir, cache)[1]["sequential"].cache_bytes
        measured, cache_result = measure_all(config_dir, cache_dir, workload, cache, args.jobs)
    on_gpu = measured["basic"]["device"] == "cuda"
    figures = {
        "settings": {
            "pipelines": asdict(workload),
            "cache": asdict(cache),
            "quick": args.quick,
            "jobs": args.jobs,
            "threads_per_process": 1,
            "tolerance": TOLERANCE,
        },
        "on_gpu": on_gpu,
        "chosen": chosen,
        "estimates": {name: estimate_figures(estimates[name], on_gpu) for name in PIPELINES},
        "measured": measured,
        "solver_bytes": solver_figure(measured),
        "cache": {**cache_result, "estimated_cache_bytes": cache_estimate},
    }
    goals, notes = judge(figures), run_notes(figures)
    print()
    print_tables(figures, goals, notes)
    record.write(figures, goals=goals, notes=notes, path=args.result)
    print(
        f"load average (1 min) at end: {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
