"""``compress`` an 8B-shaped bf16 Llama with random weights: seconds and peaks per phase, the plan.

The model (Llama-3-8B's shape: 32 layers, hidden 4096, MLP 14336, 32 heads of which 8 for
keys and values, 128,256 tokens) is written to local disk first, its random weights drawn on
the run's device and saved shard by shard, so the host never holds the model. Then
``compress`` streams it (weights read from disk a layer at a time, written out as each layer
is done) through the sequential pipeline, GPTQ W4A16, on ``samples`` rows of 2048 random
tokens: as many as the step's budget allows, up to 512 (:func:`choose_samples`, from the rates
the ``kernels`` step measured on the same device). It runs with error propagation (the goal's
run), then, when the budget still holds it, without (``propagate=False``: what the
propagation passes cost, beside it); ``--no-propagate`` to ``run.py`` runs only the latter.

Reported per run: seconds and device peak per phase (:mod:`phases`: load, trace, forwards,
Hessians, solves, propagation's compute and host copies, write), the plan's device estimate
per phase for the pipeline that ran beside the measured peaks, ``plan_peak_ratio`` (the run's
device peak over the plan's estimate), and the host's peak resident set, whole and above what
the process held before the call.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from common import GiB, Deadline
from phases import PhaseMeter, phase_peaks_against_plan
from llmc_trace import CompressRequest, compress
from llmc_trace.core.device_peak import reset_peak

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_rss.py
from _rss import peak_rss_since_reset, reset_peak_rss, resident_bytes  # noqa: E402

#: (hidden, intermediate, layers, heads, kv heads, vocabulary)
FULL_SHAPE = (4096, 14336, 32, 32, 8, 128256)
SMALL_SHAPE = (128, 384, 2, 4, 2, 1024)  # widths: multiples of the group of 128
FULL_SEQ_LEN, SMALL_SEQ_LEN = 2048, 64
FULL_SAMPLES = (512, 256, 128, 64, 32, 16)
SMALL_SAMPLES = (8, 4)
FULL_BATCH, SMALL_BATCH = 8, 4
SHARD_BYTES = 4 * GiB
#: share of the measured bf16 matrix rate that a decoder layer's forward reaches (its
#: products are smaller than the 8192-cube that measured the rate, and attention, norms and
#: the hooks' copies add time)
FORWARD_EFFICIENCY = 0.4
#: seconds beside the layers: import-free setup, tracing and the twin's proof, the head
FIXED_S = 30.0
#: the share of the budget a prediction may fill: a step that overruns its budget is killed
#: and loses its figures, one that ends early only leaves seconds unused
SAFETY = 0.8


def llama_config(shape: tuple[int, ...]) -> LlamaConfig:
    hidden, intermediate, layers, heads, kv_heads, vocab = shape
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def write_random_llama(folder: Path, config: LlamaConfig, device: torch.device, seed: int) -> int:
    """Save a Llama of ``config`` with random bf16 weights in ``folder``; returns its bytes.

    The weights are drawn on ``device`` (seconds on a GPU, where 8 billion normal draws on
    the CPU take minutes), as transformers initialises them: normal with std 0.02, norms 1.
    Shards of at most ``SHARD_BYTES`` are written one at a time with their index, so the host
    holds one shard at most.
    """
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    specs = [(name, tuple(p.shape)) for name, p in skeleton.state_dict().items()]
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = math.prod(shape) * 2
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    generator = torch.Generator(device=device).manual_seed(seed)
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if len(shape) == 1:  # RMSNorm weights
                value = torch.ones(shape, dtype=torch.bfloat16)
            else:
                drawn = torch.empty(shape, device=device).normal_(0, 0.02, generator=generator)
                value = drawn.bfloat16().cpu()
            tensors[name] = value
            weight_map[name] = file
            total += value.numel() * 2
        save_file(tensors, folder / file, metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return total


def predicted_s(
    samples: int, seq_len: int, shape: tuple[int, ...], kernels: dict[str, Any]
) -> float | None:
    """Seconds ``compress`` should take on ``samples`` rows, from the ``kernels`` step's
    figures on the same device: per layer, two forward passes (calibrate, propagate) at
    ``FORWARD_EFFICIENCY`` of the bf16 rate, the Hessians at their measured tokens per second
    (q/k/v, o and gate/up read 4096-wide inputs, down 14336-wide), and the seven GPTQ solves
    at their measured seconds; plus ``FIXED_S``. None when a needed figure is missing."""
    hidden, intermediate, layers, heads, kv_heads, _ = shape
    by_name = {row["name"]: row for row in kernels.get("shapes", [])}
    needed = ("8B q/o_proj", "8B gate/up_proj", "8B down_proj")
    if any(name not in by_name for name in needed) or "bf16_matmul_tflops" not in kernels:
        return None
    q, up, down = (by_name[name] for name in needed)
    kv_solve_s = by_name.get("8B k/v_proj", q)["gptq_s"]  # at most q's: fewer rows, same sweep
    tokens = samples * seq_len
    kv = hidden * kv_heads // heads
    linear = hidden * (2 * hidden + 2 * kv) + 3 * hidden * intermediate  # parameters
    attention = 2 * seq_len * hidden  # multiply-adds per token: scores and values, causal
    forward = 2 * 2 * tokens * (linear + attention)
    forward_s = forward / (kernels["bf16_matmul_tflops"] * 1e12 * FORWARD_EFFICIENCY)
    hessian_s = 3 * tokens / q["hessian_tokens_per_s"] + tokens / down["hessian_tokens_per_s"]
    solve_s = 2 * q["gptq_s"] + 2 * kv_solve_s + 2 * up["gptq_s"] + down["gptq_s"]
    return FIXED_S + layers * (forward_s + hessian_s + solve_s)


def choose_samples(
    candidates: tuple[int, ...],
    seq_len: int,
    shape: tuple[int, ...],
    kernels: dict[str, Any],
    budget_s: float,
) -> tuple[int, dict[int, float | None]]:
    """The most samples (of ``candidates``) whose predicted seconds fit ``SAFETY`` of
    ``budget_s``, the fewest when none does or nothing can be predicted; and each prediction."""
    predictions = {n: predicted_s(n, seq_len, shape, kernels) for n in candidates}
    usable_s = SAFETY * budget_s
    fitting = [n for n, s in predictions.items() if s is not None and s <= usable_s]
    return (max(fitting) if fitting else min(candidates)), predictions


def compress_once(
    request_options: dict[str, Any], propagate: bool, device: torch.device, save: Any
) -> dict[str, Any]:
    """One ``compress`` of the written model, measured per phase (see the module docstring)."""
    request = CompressRequest(**request_options, propagate=propagate)
    meter = PhaseMeter(lambda phases: save({"phases_s": dict(phases)}), device)
    try:
        baseline = reset_peak_rss()
        whole_process = False
    except OSError:  # no /proc/self/clear_refs: the peak then includes writing the model
        baseline, whole_process = resident_bytes(), True
    if device.type == "cuda":
        reset_peak(device)
    with meter.instrumented():
        result = compress(request, device=device, progress=meter)
    estimate = result.plan.estimate(result.pipeline)
    device_peak = max(meter.peaks.values()) if meter.peaks else None
    host_peak = peak_rss_since_reset()
    out = Path(request_options["out_dir"])
    return {
        "propagate": propagate,
        "pipeline": result.pipeline,
        "compress_s": result.elapsed_s,
        "phases_s": meter.phases_s,
        "solve_s": sum(layer.seconds for layer in result.layers),
        "layers": len(result.layers),
        "device_peak_bytes": device_peak,
        "phase_peak_bytes": meter.peaks or None,
        "plan_device_bytes": estimate.device_bytes,
        "plan_phase_bytes": estimate.device_phases,
        "phases_against_plan": phase_peaks_against_plan(meter.peaks, estimate.device_phases),
        "plan_peak_ratio": device_peak / estimate.device_bytes if device_peak else None,
        "host_peak_bytes": host_peak,
        "host_growth_bytes": host_peak - baseline,
        "host_peak_is_whole_process": whole_process,
        "plan_host_bytes": estimate.host_bytes,
        "checkpoint_bytes": sum(p.stat().st_size for p in out.glob("*.safetensors")),
    }


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    device = torch.device(spec["device"])
    deadline = Deadline(spec["budget_s"])
    small = spec["small"]
    shape = SMALL_SHAPE if small else FULL_SHAPE
    seq_len = SMALL_SEQ_LEN if small else FULL_SEQ_LEN
    work = Path(spec["work"]) / "llama"
    folder = work / "model"
    config = llama_config(shape)
    names = ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab")
    figures: dict[str, Any] = {"shape": dict(zip(names, shape)), "runs": {}, "skipped": []}
    start = time.perf_counter()
    figures["model_bytes"] = write_random_llama(folder, config, device, spec["seed"])
    figures["write_model_s"] = time.perf_counter() - start
    save(figures)

    kernels_result = Path(spec["kernels_result"])  # the same device's rates, when measured
    kernels = json.loads(kernels_result.read_text())["figures"] if kernels_result.exists() else {}
    samples, predictions = choose_samples(
        SMALL_SAMPLES if small else FULL_SAMPLES, seq_len, shape, kernels, deadline.left_s()
    )
    rows = np.random.default_rng(spec["seed"]).integers(0, shape[-1], (samples, seq_len))
    np.save(work / "calib.npy", rows.astype(np.int32))
    figures.update(
        samples=samples,
        seq_len=seq_len,
        tokens=samples * seq_len,
        predicted_s={str(n): s for n, s in predictions.items()},
    )
    options = {
        "model": str(folder),
        "dataset": str(work / "calib.npy"),
        "out_dir": str(work / "out"),
        "scheme": "W4A16",
        "samples": samples,
        "seq_len": seq_len,
        "batch_size": SMALL_BATCH if small else FULL_BATCH,
        "pipeline": "sequential",
        "overwrite": True,
    }
    variants = [False] if spec.get("no_propagate") else [True, False]
    for propagate in variants:
        key = "propagate" if propagate else "no_propagate"
        if figures["runs"]:  # the second run: what the first took, less its propagation
            first = next(iter(figures["runs"].values()))
            phases = first["phases_s"]
            expected = first["compress_s"] - sum(
                phases.get(p, 0.0) for p in ("propagate_compute", "propagate_copy")
            )
            if not deadline.allows(expected / SAFETY):
                figures["skipped"].append(key)
                save(figures)
                continue

        def save_progress(progress: dict[str, Any], key: str = key) -> None:
            save({**figures, "runs": {**figures["runs"], key: progress}})

        figures["runs"][key] = compress_once(options, propagate, device, save_progress)
        save(figures)
    goal_run = figures["runs"].get("propagate") or next(iter(figures["runs"].values()))
    figures.update(goal_run)  # the goal's figures at the top, as the summary reads them
    return figures
