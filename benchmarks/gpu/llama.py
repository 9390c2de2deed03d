"""``compress`` an 8B-shaped bf16 Llama with random weights: seconds per phase, peaks against the plan.

The model (Llama-3-8B's shape: 32 layers, hidden 4096, MLP 14336, 32 heads of which 8 for
keys and values, 128,256 tokens) is written to local disk first, its random weights drawn on
the run's device and saved shard by shard, so the host never holds the model. Then one
``compress`` call streams it (weights read from disk a layer at a time, written out as each
layer is done) through the sequential pipeline, GPTQ W4A16, on ``samples`` rows of 2048
random tokens: as many as the step's budget allows, up to 512 (:func:`choose_samples`, from
the rates the ``kernels`` step measured on the same device).

Reported: seconds per phase, from the progress ``compress`` reports (``load``, ``trace``:
tracing, the tiny twin's proof, planning and the first cache; ``calibrate``: forward passes
with the Hessians' hooks, reading weights, and the solves, also given alone as ``solve``;
``propagate``: the passes on the compressed layer; ``write``: the checkpoint's last shard and
its files), the device's peak against the plan's device estimate for the pipeline that ran,
and the host's peak resident set, whole and above what the process held before the call.
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
from llmc_trace import CompressRequest, compress

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
    at their measured seconds (k and v as q: a solve's time is its column sweep, which does
    not shrink with fewer rows); plus ``FIXED_S``. None when a needed figure is missing."""
    hidden, intermediate, layers, heads, kv_heads, _ = shape
    by_name = {row["name"]: row for row in kernels.get("shapes", [])}
    needed = ("8B q_proj", "8B gate_proj", "8B down_proj")
    if any(name not in by_name for name in needed) or "bf16_matmul_tflops" not in kernels:
        return None
    q, up, down = (by_name[name] for name in needed)
    tokens = samples * seq_len
    kv = hidden * kv_heads // heads
    linear = hidden * (2 * hidden + 2 * kv) + 3 * hidden * intermediate  # parameters
    attention = 2 * seq_len * hidden  # multiply-adds per token: scores and values, causal
    forward = 2 * 2 * tokens * (linear + attention)
    forward_s = forward / (kernels["bf16_matmul_tflops"] * 1e12 * FORWARD_EFFICIENCY)
    hessian_s = 3 * tokens / q["hessian_tokens_per_s"] + tokens / down["hessian_tokens_per_s"]
    solve_s = 4 * q["gptq_s"] + 2 * up["gptq_s"] + down["gptq_s"]
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


class PhaseClock:
    """A progress reporter that times ``compress``'s phases (see the module docstring).

    The seconds from one report to the next belong to the phase of the first; ``save`` is
    called whenever the label changes, so a step killed mid-run still leaves its phases.
    """

    def __init__(self, save: Any) -> None:
        self.save = save
        self.phases_s: dict[str, float] = {}
        self._label: str | None = None
        self._since = time.perf_counter()

    @staticmethod
    def phase(label: str) -> str:
        if label.startswith("subgraph"):
            return "propagate" if label.endswith("propagate") else "calibrate"
        return label

    def __call__(self, label: str, done: int, total: int) -> None:
        if label != self._label:
            self.close()
            self._label = label
            self.save(self.phases_s)

    def close(self) -> None:
        """Give the time since the last report to its phase."""
        now = time.perf_counter()
        if self._label is not None:
            phase = self.phase(self._label)
            self.phases_s[phase] = self.phases_s.get(phase, 0.0) + now - self._since
        self._since = now


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    device = torch.device(spec["device"])
    deadline = Deadline(spec["budget_s"])
    small = spec["small"]
    shape = SMALL_SHAPE if small else FULL_SHAPE
    seq_len = SMALL_SEQ_LEN if small else FULL_SEQ_LEN
    work = Path(spec["work"]) / "llama"
    folder, out = work / "model", work / "out"
    config = llama_config(shape)
    names = ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab")
    figures: dict[str, Any] = {"shape": dict(zip(names, shape))}
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
    request = CompressRequest(
        str(folder),
        dataset=str(work / "calib.npy"),
        out_dir=str(out),
        scheme="W4A16",
        samples=samples,
        seq_len=seq_len,
        batch_size=SMALL_BATCH if small else FULL_BATCH,
        pipeline="sequential",
        overwrite=True,
    )
    clock = PhaseClock(lambda phases: save({**figures, "phases_s": dict(phases)}))
    try:
        baseline = reset_peak_rss()
        figures["host_peak_is_whole_process"] = False
    except OSError:  # no /proc/self/clear_refs: the peak then includes writing the model
        baseline = resident_bytes()
        figures["host_peak_is_whole_process"] = True
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    result = compress(request, device=device, progress=clock)
    clock.close()
    estimate = result.plan.estimate(result.pipeline)
    device_peak = None
    if device.type == "cuda":
        device_peak = max(
            torch.cuda.max_memory_allocated(device), result.report.device_peak_bytes or 0
        )
    host_peak = peak_rss_since_reset()
    solve_s = sum(layer.seconds for layer in result.layers)
    figures.update(
        pipeline=result.pipeline,
        compress_s=result.elapsed_s,
        phases_s=clock.phases_s,
        solve_s=solve_s,
        layers=len(result.layers),
        device_peak_bytes=device_peak,
        plan_device_bytes=estimate.device_bytes,
        device_peak_over_plan=device_peak / estimate.device_bytes if device_peak else None,
        host_peak_bytes=host_peak,
        host_growth_bytes=host_peak - baseline,
        plan_host_bytes=estimate.host_bytes,
        checkpoint_bytes=sum(p.stat().st_size for p in out.glob("*.safetensors")),
    )
    return figures
