"""Per-layer GPTQ and SparseGPT seconds over their matrix-product floor, and the Hessian's rate.

For each weight shape (out, in), as ``nn.Linear.weight`` holds it: bf16 inputs X (tokens, in)
folded into the float32 Hessian by :class:`~llmc_trace.algorithms.HessianAccumulator` (its
tokens per second, the rate of the products it runs, and that rate over the device's measured
matrix peak for the same kind of product), then GPTQ W4A16 and SparseGPT at 50 % and at 2:4
on a bf16 W with that Hessian.

The floor is the matrix work the solves cannot avoid, timed alone on the same device: the
damped Hessian's factorisation (:func:`~llmc_trace.algorithms.sweep_factor`: one Cholesky
factorisation of the (in, in) Hessian) and the lazy block updates,
``G[:, i2:] += D @ R[i1:i2, i2:]`` for every block of 128 columns, with the same shapes and
dtypes as the sweep. What a solve spends beyond the floor is the column-by-column sweep
inside each block, which the Triton kernel (:mod:`llmc_trace.algorithms.sweep_kernel`) runs as
one launch per block.

Every figure is the median of ``REPEATS`` timings after one warm-up, with the fastest, the
slowest and the spread beside it: one timing of the same shape's floor differed 1.6x between
two device runs. ``gptq_floor_ratio`` and ``sparsegpt_floor_ratio`` (the larger of 50 % and
2:4) are the medians' ratios the goals judge.

Before the timings, the sweep kernel is held against the torch loop on one small layer
(:func:`kernel_agreement`): GPTQ's integers and SparseGPT's masks and weights at 50 % and 2:4.
On a GPU the compiled kernel; in the dry run on the CPU, Triton's interpreter in a child
process (``TRITON_INTERPRET=1`` must be set before Triton is first imported), so the dry run
exercises the kernels the device run will use.

The shapes are every projection of Llama-3-8B and Llama-3-70B (q and o share one, as do k and
v, and gate and up); the 70B MLP's Hessian takes 3.3 GB in float32. They run cheapest first,
so that what the step's deadline leaves out is the most expensive and is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

from common import Deadline, timings
from llmc_trace.algorithms import (
    HessianAccumulator,
    QuantizationArgs,
    gptq,
    sparsegpt,
    sweep_factor,
)
from llmc_trace.algorithms.sweep_kernel import kernel_fallback_reason, kernel_sweeps
from llmc_trace.core.solver import SolverSettings

#: (name, out, in): Llama-3-8B's and -70B's projections (hidden 4096 / 8192, 8 key-value
#: heads of 128, MLP 14336 / 28672), and tiny ones with the same aspect for the dry run
FULL_SHAPES = [
    ("8B q/o_proj", 4096, 4096),
    ("8B k/v_proj", 1024, 4096),
    ("8B gate/up_proj", 14336, 4096),
    ("8B down_proj", 4096, 14336),
    ("70B q/o_proj", 8192, 8192),
    ("70B k/v_proj", 1024, 8192),
    ("70B gate/up_proj", 28672, 8192),
    ("70B down_proj", 8192, 28672),
]
SMALL_SHAPES = [  # multiples of W4A16's group of 128 columns
    ("8B q/o_proj", 128, 128),
    ("8B k/v_proj", 32, 128),
    ("8B gate/up_proj", 384, 128),
    ("8B down_proj", 128, 384),
    ("70B q/o_proj", 256, 256),
    ("70B k/v_proj", 32, 256),
    ("70B gate/up_proj", 768, 256),
    ("70B down_proj", 256, 768),
]
#: tokens per Hessian update: one batch of 4 x 2048 on the GPU
FULL_TOKENS, SMALL_TOKENS = 8192, 512
BLOCKSIZE = 128  # GPTQ's and SparseGPT's default
#: the square product that measures the device's matrix rate
FULL_MATMUL, SMALL_MATMUL = 8192, 256
#: timings per figure after the warm-up (the issue asks at least 5)
REPEATS = 5
#: W4A16's weights (the compressed-tensors preset, ``tests/test_gpu_benchmark.py`` holds them
#: equal), written out: reading the preset imports compressed-tensors, and with it
#: transformers, seconds the interpreter's child would spend on nothing else
W4A16_WEIGHTS = QuantizationArgs(
    num_bits=4, symmetric=True, strategy="group", group_size=128, actorder="static"
)


def matmul_tflops(size: int, dtype: torch.dtype, device: torch.device, tf32: bool = False) -> float:
    """Achieved TFLOP/s of one (size, size) x (size, size) product in ``dtype`` (the median of
    ``REPEATS``); ``tf32`` lets float32 products run on the tensor cores, as the Hessian's do
    for 16-bit inputs on a GPU."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        seconds = timings(lambda: a @ b, device, REPEATS)["median_s"]
    finally:
        matmul.fp32_precision = previous
    return 2 * size**3 / seconds / 1e12


def hessian_flops(tokens: int, in_features: int) -> int:
    """Floating-point operations of one ``HessianAccumulator.add`` of ``tokens`` rows: the
    lower triangle, one band of ``BAND`` columns against every row below it."""
    band = HessianAccumulator.BAND
    return sum(
        2 * tokens * (in_features - a) * (min(a + band, in_features) - a)
        for a in range(0, in_features, band)
    )


def block_products(G: torch.Tensor, R: torch.Tensor) -> None:
    """The sweep's lazy updates alone: every block's weight changes times its rows of ``R``."""
    columns = G.shape[1]
    D = torch.randn(G.shape[0], BLOCKSIZE, device=G.device)  # (out, block)
    for i1 in range(0, columns, BLOCKSIZE):
        i2 = min(i1 + BLOCKSIZE, columns)
        G[:, i2:].addmm_(D[:, : i2 - i1], R[i1:i2, i2:])


def measure_shape(
    name: str,
    out_features: int,
    in_features: int,
    tokens: int,
    device: torch.device,
    seed: int,
    hessian_peak_tflops: float,
) -> dict[str, Any]:
    """Every figure of one shape (see the module docstring)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    X = torch.randn(tokens, in_features, generator=generator, device=device).bfloat16()
    W = (
        0.02 * torch.randn(out_features, in_features, generator=generator, device=device)
    ).bfloat16()
    accumulator = HessianAccumulator(in_features, device=device)
    add = timings(lambda: accumulator.add(X), device, REPEATS)
    H = accumulator.H
    percdamp = SolverSettings().percdamp
    factor = timings(lambda: sweep_factor(H, percdamp), device, REPEATS)
    products = timings(
        partial(block_products, W.float(), sweep_factor(H, percdamp).R), device, REPEATS
    )  # its float32 W and factor (4 GB at the 70B MLP's shapes) go with the partial
    solves = {
        "gptq": timings(lambda: gptq(W, H, W4A16_WEIGHTS), device, REPEATS),
        "sparsegpt": timings(lambda: sparsegpt(W, H, 0.5), device, REPEATS),
        "sparsegpt_2of4": timings(lambda: sparsegpt(W, H, (2, 4)), device, REPEATS),
    }
    floor_s = factor["median_s"] + products["median_s"]
    hessian_tflops = hessian_flops(tokens, in_features) / add["median_s"] / 1e12
    row: dict[str, Any] = {
        "name": name,
        "out_features": out_features,
        "in_features": in_features,
        "hessian_tokens": tokens,
        "hessian_add": add,
        "hessian_tokens_per_s": tokens / add["median_s"],
        "hessian_tflops": hessian_tflops,
        "hessian_over_matmul_peak": hessian_tflops / hessian_peak_tflops,
        "factor": factor,
        "block_products": products,
        "floor_s": floor_s,
    }
    for solve, timed in solves.items():
        row[solve] = timed
        row[f"{solve}_s"] = timed["median_s"]
        row[f"{solve}_floor_ratio"] = timed["median_s"] / floor_s
    row["sparsegpt_floor_ratio"] = max(
        row["sparsegpt_floor_ratio"], row["sparsegpt_2of4_floor_ratio"]
    )
    return row


def kernel_agreement(device: torch.device) -> dict[str, Any]:
    """The sweep kernel against the torch loop on one 40 x 128 layer (two blocks of 64 columns,
    rows not a multiple of the kernel's tile): the share of GPTQ's integers, and of SparseGPT's mask
    and weights, that differ (0.0 on the CPU's interpreter; on a GPU the loop's rank-1
    updates may fuse multiply and add), whether the kernel ran at all, and if not, why
    (``fallback``: the ``KernelFallbackWarning``'s reason)."""
    gptq_module = sys.modules[gptq.__module__]
    sparsegpt_module = sys.modules[sparsegpt.__module__]
    generator = torch.Generator().manual_seed(0)
    W = (torch.randn(40, 128, generator=generator) * 0.02).to(device)
    X = torch.randn(512, 128, generator=generator) * torch.linspace(0.2, 3.0, 128)
    H = (2 * X.T @ X / 512).to(device)
    blocks = SolverSettings(blocksize=64)
    solvers = {
        "gptq": lambda: gptq(W, H, W4A16_WEIGHTS, blocks).quantized.int_weight,
        "sparsegpt": lambda: sparsegpt(W, H, 0.5, settings=blocks),
        "sparsegpt_2of4": lambda: sparsegpt(W, H, (2, 4), settings=blocks),
    }
    through_kernel = {name: solve() for name, solve in solvers.items()}
    saved = gptq_module.kernel_sweeps, sparsegpt_module.kernel_sweeps
    gptq_module.kernel_sweeps = sparsegpt_module.kernel_sweeps = lambda grid, device: False
    try:
        through_loop = {name: solve() for name, solve in solvers.items()}
    finally:
        gptq_module.kernel_sweeps, sparsegpt_module.kernel_sweeps = saved

    def differing(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a != b).float().mean().item()

    result: dict[str, Any] = {
        "kernel_ran": kernel_sweeps(None, device),
        "fallback": kernel_fallback_reason(),
    }
    result["gptq_integers_differing"] = differing(through_kernel["gptq"], through_loop["gptq"])
    for name in ("sparsegpt", "sparsegpt_2of4"):
        kernel, loop = through_kernel[name], through_loop[name]
        result[f"{name}_mask_differing"] = differing(kernel.pruned, loop.pruned)
        result[f"{name}_weight_differing"] = differing(kernel.weight, loop.weight)
    return result


def interpreted_agreement() -> dict[str, Any]:
    """:func:`kernel_agreement` on the CPU through Triton's interpreter, in a child process;
    ``{"skipped": why}`` where Triton is not installed."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return {"skipped": f"Triton cannot be imported ({err})"}
    here = str(Path(__file__).resolve().parent)
    code = (
        "import json, torch; from kernel_speed import kernel_agreement; "
        "print(json.dumps(kernel_agreement(torch.device('cpu'))))"
    )
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path},
    )
    if child.returncode:
        raise RuntimeError(f"the interpreted kernel check failed: {child.stderr[-2000:]}")
    return json.loads(child.stdout.splitlines()[-1])


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    """Every shape the step's deadline allows, cheapest first; a shape whose predicted seconds
    (the previous shape's, scaled by out x in^2: the block products and the sweep's updates)
    do not fit what is left is skipped and named."""
    device = torch.device(spec["device"])
    deadline = Deadline(spec["budget_s"])
    small = spec["small"]
    shapes = sorted(SMALL_SHAPES if small else FULL_SHAPES, key=lambda s: s[1] * s[2] ** 2)
    tokens = SMALL_TOKENS if small else FULL_TOKENS
    size = SMALL_MATMUL if small else FULL_MATMUL
    on_cuda = device.type == "cuda"
    result: dict[str, Any] = {
        "repeats": REPEATS,
        "bf16_matmul_tflops": matmul_tflops(size, torch.bfloat16, device),
        "fp32_matmul_tflops": matmul_tflops(size, torch.float32, device),
        # what the Hessian's products of bf16 inputs run on: TF32 tensor cores on a GPU
        "hessian_peak_kind": "tf32" if on_cuda else "fp32",
        "shapes": [],
        "skipped": [],
    }
    result["kernel_agreement"] = kernel_agreement(device) if on_cuda else interpreted_agreement()
    # after the agreement's launches: whether the timed sweeps below run the kernel (on a GPU
    # one that failed to compile there sweeps with torch ops; the agreement says why)
    result["sweep_kernel"] = kernel_sweeps(None, device)
    save(result)
    peak = matmul_tflops(size, torch.float32, device, tf32=True) if on_cuda else None
    result["tf32_matmul_tflops"] = peak
    hessian_peak = peak if peak is not None else result["fp32_matmul_tflops"]
    # one small solve of each kind first: handles and kernels load outside the timings
    measure_shape("warm-up", 128, 128, 256, device, spec["seed"], hessian_peak)
    previous: tuple[float, int] | None = None  # (seconds, out * in^2) of the last shape
    for name, out_features, in_features in shapes:
        cost = out_features * in_features**2
        if previous is not None and not deadline.allows(previous[0] * cost / previous[1]):
            result["skipped"].append(name)
            continue
        started = deadline.elapsed_s()
        result["shapes"].append(
            measure_shape(
                name, out_features, in_features, tokens, device, spec["seed"], hessian_peak
            )
        )
        previous = (deadline.elapsed_s() - started, cost)
        save(result)
        if on_cuda:
            torch.cuda.empty_cache()
    return result
