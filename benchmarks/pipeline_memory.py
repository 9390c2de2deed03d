"""Peak memory of each calibration pipeline, measured against the memory plan's estimate.

Part 1 runs ``basic``, ``layer_sequential`` and ``sequential`` on a 16-layer Llama of tiny
width (hidden 512, MLP 1536, 8 heads, vocabulary 4096; float32, eager attention, seeded random
weights) over 256 samples of 64 tokens (batch size 1), with ``LayerCompressor("gptq",
W4A16)`` listening: real GPTQ, so the compressor's whole state is there (Hessians shared by
q/k/v and by gate/up, GPTQ's working tensors, the quantized weights it keeps for the
checkpoint). Each pipeline runs in a fresh process. Its peak is CUDA's
``max_memory_allocated`` when a GPU is present, else the peak resident set (kernel VmHWM, reset
just before the pipeline) minus the resident set right before the pipeline starts: weights,
batches and the traced subgraphs are already resident then and are not counted.

The estimate comes from ``plan_memory`` (``estimate_pipelines`` on the meta trace) with the
same settings. On a GPU, the measured peak is compared with ``device_bytes``. On a CPU the
device and the host are one memory, so the number compared is what the estimates say will be
resident in it beyond what was resident before the pipeline: ``device_bytes + host_bytes``,
minus the weights (``host_bytes`` holds all of them, and they were resident before) and minus
the weights inside ``device_bytes`` (all of them for basic, the largest target for
layer_sequential, the largest subgraph for sequential), since on one memory those are the same
bytes. The target is an estimate within 25 % of the measurement.

Part 2 runs ``sequential`` (with callbacks that change nothing) on an 80-layer Llama of tiny
width over 64 samples and reports the intermediates cache: which values it stores once for all
samples (``shared_names``: causal mask, rotary cos/sin, ...) and its peak bytes, against the
bytes if every sample kept its own copy of those values, and the resident growth sampled in
the first subgraphs, the others and the last.

    python benchmarks/pipeline_memory.py            # about 5 minutes on 2 idle cores
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _rss import peak_rss_since_reset, reset_peak_rss, resident_bytes

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
    is first handed back to the kernel (``malloc_trim``), so the baseline holds live data only.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.peak_bytes = 0
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
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self.start_bytes
        else:
            self.peak_bytes = peak_rss_since_reset() - self.start_bytes


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
    from llmc_trace.oneshot.compressor import LayerCompressor
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
    from llmc_trace.pipelines.cache import nbytes
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
        "shared_bytes": {name: nbytes(values.get(name)) for name in stats.shared_names},
        "peak_cache_bytes": stats.peak_cache_bytes,
        "num_subgraphs": len(subgraphs),
        "stage_bytes": peak.stage_bytes,
    }


# ---------------------------------------------------------------- estimating (parent)
@dataclass(frozen=True)
class Estimate:
    """The plan's figures for one pipeline, and the one-memory figure compared on a CPU."""

    pipeline: str
    device_bytes: int
    host_bytes: int
    cache_bytes: int
    device_weight_bytes: int
    weight_bytes: int

    @property
    def one_memory_bytes(self) -> int:
        """Resident beyond the weights when device and host are the same memory."""
        return self.device_bytes + self.host_bytes - self.weight_bytes - self.device_weight_bytes


def plan_estimates(config_dir: Path, workload: Workload) -> tuple[str, dict[str, Estimate]]:
    """The plan's choice and its estimates, with the weights each device estimate holds."""
    from llmc_trace.graph.partition import partition_trace
    from llmc_trace.models.build import build_meta_model
    from llmc_trace.models.samples import SampleOptions, make_sample
    from llmc_trace.models.source import resolve_model
    from llmc_trace.plan import RunSettings, plan_source
    from llmc_trace.core.sizes import parameter_bytes
    from llmc_trace.tracing.trace import trace_graph

    settings = RunSettings(workload.samples, workload.seq_len, batch_size=1, dtype_bytes=4)
    (plan,) = plan_source(str(config_dir), [settings], device_memory=2**50, host_memory=2**50)
    model = build_meta_model(resolve_model(str(config_dir)))
    partitioned = partition_trace(
        trace_graph(model, make_sample(model.config, "text", SampleOptions()))
    )

    def param_bytes(modules: list[Any]) -> int:
        return parameter_bytes(modules, settings.dtype_bytes)

    weights = param_bytes(list(model.modules()))
    device_weights = {
        "basic": weights,
        "layer_sequential": max(
            param_bytes(list(model.get_submodule(t).modules()))
            for t in partitioned.trace.leaves.targets
        ),
        "sequential": max(param_bytes(s.submodules(model)) for s in partitioned.subgraphs),
    }
    estimates = {
        e.pipeline: Estimate(
            e.pipeline,
            e.device_bytes,
            e.host_bytes,
            e.cache_bytes,
            device_weights[e.pipeline],
            weights,
        )
        for e in plan.estimates
        if e.pipeline in device_weights
    }
    return plan.chosen, estimates


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


# ---------------------------------------------------------------- printing
def mib(value: float) -> str:
    return f"{value / MiB:8.1f}"


def print_pipelines(
    workload: Workload, chosen: str, estimates: dict[str, Estimate], measured: dict[str, dict]
) -> None:
    on_gpu = measured["basic"]["device"] == "cuda"
    print(f"Part 1: pipelines with GPTQ W4A16 (LayerCompressor) on {workload.describe()}")
    print(f"  the plan chooses: {chosen}")
    if on_gpu:
        print("  measured: CUDA max_memory_allocated during the pipeline; compared: device_bytes")
    else:
        print("  measured: peak RSS of a fresh process minus its RSS right before the pipeline")
        print("  compared: device_bytes + host_bytes − all weights − weights inside device_bytes")
        print("            (CPU: device and host are one memory; weights were resident before)")
    print()
    print(
        f"  {'pipeline':<17}{'device est':>11}{'host est':>11}{'cache est':>11}"
        f"{'compared':>11}{'measured':>11}{'est/meas':>10}  {'within 25%':<10}{'time s':>8}"
    )
    for name in PIPELINES:
        estimate, result = estimates[name], measured[name]
        compared = estimate.device_bytes if on_gpu else estimate.one_memory_bytes
        ratio = compared / result["peak_bytes"]
        verdict = "yes" if abs(ratio - 1) <= TOLERANCE else "NO"
        print(
            f"  {name:<17}{mib(estimate.device_bytes):>11}{mib(estimate.host_bytes):>11}"
            f"{mib(estimate.cache_bytes):>11}{mib(compared):>11}{mib(result['peak_bytes']):>11}"
            f"{ratio:>9.2f}×  {verdict:<10}{result['elapsed_s']:>8.0f}"
        )
    print(f"  (MiB; weights in the estimates: {estimates['basic'].weight_bytes / MiB:.1f} MiB)")
    print()
    print_stages(measured)
    print_breakdown(estimates, measured)
    print_device_ratio(estimates, measured, on_gpu)


def print_stages(measured: dict[str, dict]) -> None:
    """Where each pipeline holds the most, sampled at batch boundaries (GPTQ runs between)."""
    print("  growth sampled at batch boundaries, by stage (MiB; GPTQ's own peaks fall between):")
    for name in PIPELINES:
        stages = sorted(measured[name]["stage_bytes"].items(), key=lambda item: -item[1])
        top = ", ".join(f"{label} {value / MiB:.1f}" for label, value in stages[:2])
        print(f"    {name:<17} highest: {top}")
        if len(stages) > 2:
            print(f"    {'':<17} lowest:  {stages[-1][0]} {stages[-1][1] / MiB:.1f}")
    print()


def print_breakdown(estimates: dict[str, Estimate], measured: dict[str, dict]) -> None:
    """The compressor state behind the measured peaks, from the workers' own accounting."""
    import torch

    from llmc_trace.plan.estimate import solver_bytes

    basic, sequential = measured["basic"], measured["sequential"]
    gptq = basic["gptq_working"]
    out_features, in_features = gptq["shape"]
    print("  compressor state behind the measurements (MiB):")
    print(
        f"    Hessians of one decoder layer: {basic['hessian_bytes_per_layer'] / MiB:.1f} "
        f"(q/k/v and gate/up share one each); the estimate counts "
        f"{basic['estimated_hessian_bytes_per_layer'] / MiB:.1f} (one per distinct input, "
        f"observed on meta)"
    )
    print(
        f"    one GPTQ call on {gptq['name']} ({out_features}×{in_features}): "
        f"{gptq['peak_bytes'] / MiB:.1f} of working memory "
        f"(the plan's solver_bytes: {solver_bytes(torch.nn.Linear(in_features, out_features, device='meta')) / MiB:.1f})"
    )
    print(
        f"    quantized weights the compressor keeps until the checkpoint is written: "
        f"{basic['kept_bytes'] / MiB:.1f} ({basic['layers_compressed']} Linears)"
    )
    print(
        f"    sequential's cache at its peak (PipelineStats, at subgraph boundaries): "
        f"{sequential['peak_cache_bytes'] / MiB:.1f}; estimated "
        f"{estimates['sequential'].cache_bytes / MiB:.1f}"
    )
    print()


def print_device_ratio(
    estimates: dict[str, Estimate], measured: dict[str, dict], on_gpu: bool
) -> None:
    estimated = estimates["sequential"].device_bytes / estimates["basic"].device_bytes
    print(
        f"  sequential's device peak / basic's (target < {DEVICE_RATIO_TARGET}): "
        f"estimated {estimated:.2f}",
        end="",
    )
    if on_gpu:
        ratio = measured["sequential"]["peak_bytes"] / measured["basic"]["peak_bytes"]
        verdict = "meets" if ratio < DEVICE_RATIO_TARGET else "MISSES"
        print(f", measured {ratio:.2f} ({verdict} the target)")
    else:
        print("; not measured: on a CPU the device and the host")
        print("  are one memory, so there is no separate device peak (needs a GPU)")
    print()


def print_cache(workload: Workload, result: dict, estimated_cache_bytes: int) -> None:
    shared = result["shared_bytes"]
    per_sample = sum(shared.values())
    copies = result["peak_cache_bytes"] + (workload.samples - 1) * per_sample
    print(f"Part 2: sequential's intermediates cache on {workload.describe()}")
    print(
        f"  {result['num_subgraphs']} subgraphs, callbacks that change nothing, {result['elapsed_s']:.0f} s"
    )
    print("  stored once for all samples (shared_names):")
    for name in result["shared_names"]:
        print(f"    {name:<32}{shared[name] / 1024:10.1f} KiB per sample")
    rows = [
        ("peak cache bytes (PipelineStats)", result["peak_cache_bytes"]),
        ("the plan's estimate of the cache", estimated_cache_bytes),
        (
            f"if each sample kept its own copy (+{workload.samples - 1} × {per_sample / 1024:.1f} KiB)",
            copies,
        ),
        ("peak RSS growth of the whole run", result["peak_bytes"]),
    ]
    for label, value in rows:
        print(f"  {label:<52}{value / MiB:8.1f} MiB")
    stages = list(result["stage_bytes"].items())  # in run order
    middle = sorted(value for _, value in stages[2:-1])
    print("  growth sampled at batch boundaries (MiB):")
    for label, value in stages[:2]:
        print(f"    {label:<50}{value / MiB:8.1f}")
    if middle:
        print(
            f"    {'median of the subgraphs in between':<50}{middle[len(middle) // 2] / MiB:8.1f}"
        )
    print(f"    {stages[-1][0]:<50}{stages[-1][1] / MiB:8.1f}")


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
    print()
    print_pipelines(workload, chosen, estimates, measured)
    print_cache(cache, cache_result, cache_estimate)
    print()
    print(
        f"load average (1 min) at end: {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
