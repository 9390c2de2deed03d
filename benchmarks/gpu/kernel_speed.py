"""Per-layer GPTQ and SparseGPT seconds beside their matrix-product floor, and the Hessian's rate.

For each weight shape (out, in), as ``nn.Linear.weight`` holds it: bf16 inputs X (tokens, in)
folded into the float32 Hessian by :class:`~llmc_trace.algorithms.HessianAccumulator` (its
tokens per second, and the float32 rate that makes), then one GPTQ W4A16 solve and one
SparseGPT 50 % solve on a bf16 W with that Hessian.

The floor is the matrix work both solves cannot avoid, timed alone on the same device: the
damped Hessian's factorisation (:func:`~llmc_trace.algorithms.sweep_factor`: one Cholesky
factorisation of the (in, in) Hessian) and the lazy block updates,
``G[:, i2:] += D @ R[i1:i2, i2:]`` for every block of 128 columns, with the same shapes and
dtypes as the sweep. What a solve spends beyond the floor is the column-by-column sweep
inside each block: thousands of small launches, the part an H100 cannot hide.

The shapes are Llama-3-8B's attention (4096 x 4096), MLP up (14336 x 4096) and down
(4096 x 14336) projections and Llama-3-70B's down projection (8192 x 28672, whose Hessian
takes 3.3 GB in float32).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from common import Deadline, measured_once, timed_s
from llmc_trace.algorithms import W4A16, HessianAccumulator, gptq, sparsegpt, sweep_factor
from llmc_trace.core.solver import SolverSettings

#: (name, out, in): the full-size shapes, and tiny ones with the same aspect for the dry run.
FULL_SHAPES = [
    ("8B q_proj", 4096, 4096),
    ("8B gate_proj", 14336, 4096),
    ("8B down_proj", 4096, 14336),
    ("70B down_proj", 8192, 28672),
]
SMALL_SHAPES = [  # multiples of W4A16's group of 128 columns
    ("8B q_proj", 128, 128),
    ("8B gate_proj", 384, 128),
    ("8B down_proj", 128, 384),
    ("70B down_proj", 256, 768),
]
#: tokens per Hessian update: one batch of 4 x 2048 on the GPU
FULL_TOKENS, SMALL_TOKENS = 8192, 512
BLOCKSIZE = 128  # GPTQ's and SparseGPT's default
#: the square product that measures the device's matrix rate
FULL_MATMUL, SMALL_MATMUL = 8192, 256


def matmul_tflops(size: int, dtype: torch.dtype, device: torch.device) -> float:
    """Achieved TFLOP/s of one (size, size) x (size, size) product in ``dtype``."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = timed_s(lambda: a @ b, device, repeats=3)
    return 2 * size**3 / seconds / 1e12


def block_products(G: torch.Tensor, R: torch.Tensor) -> None:
    """The sweep's lazy updates alone: every block's weight changes times its rows of ``R``."""
    columns = G.shape[1]
    D = torch.randn(G.shape[0], BLOCKSIZE, device=G.device)  # (out, block)
    for i1 in range(0, columns, BLOCKSIZE):
        i2 = min(i1 + BLOCKSIZE, columns)
        G[:, i2:].addmm_(D[:, : i2 - i1], R[i1:i2, i2:])


def measure_shape(
    name: str, out_features: int, in_features: int, tokens: int, device: torch.device, seed: int
) -> dict[str, Any]:
    """Every figure of one shape (see the module docstring)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    X = torch.randn(tokens, in_features, generator=generator, device=device).bfloat16()
    W = (
        0.02 * torch.randn(out_features, in_features, generator=generator, device=device)
    ).bfloat16()
    accumulator = HessianAccumulator(in_features, device=device)
    add_s = timed_s(lambda: accumulator.add(X), device)
    H = accumulator.H
    factor_s, _ = measured_once(lambda: sweep_factor(H, SolverSettings().percdamp), device)
    products = partial(block_products, W.float(), sweep_factor(H, SolverSettings().percdamp).R)
    products_s, _ = measured_once(products, device)
    del products  # its float32 W and factor: 4 GB at the 70B shape
    gptq_s, gptq_peak = measured_once(lambda: gptq(W, H, W4A16.weights), device)
    sparsegpt_s, sparsegpt_peak = measured_once(lambda: sparsegpt(W, H, 0.5), device)
    floor_s = factor_s + products_s
    return {
        "name": name,
        "out_features": out_features,
        "in_features": in_features,
        "hessian_tokens": tokens,
        "hessian_add_s": add_s,
        "hessian_tokens_per_s": tokens / add_s,
        "hessian_tflops": 2 * tokens * in_features**2 / add_s / 1e12,
        "factor_s": factor_s,
        "block_products_s": products_s,
        "floor_s": floor_s,
        "gptq_s": gptq_s,
        "gptq_over_floor": gptq_s / floor_s,
        "gptq_peak_bytes": gptq_peak,
        "sparsegpt_s": sparsegpt_s,
        "sparsegpt_over_floor": sparsegpt_s / floor_s,
        "sparsegpt_peak_bytes": sparsegpt_peak,
    }


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    """Every shape the step's deadline allows, largest last; a shape whose predicted seconds
    (the previous shape's, scaled by out x in^2: the block products and the sweep's updates)
    do not fit what is left is skipped and named."""
    device = torch.device(spec["device"])
    deadline = Deadline(spec["budget_s"])
    small = spec["small"]
    shapes = SMALL_SHAPES if small else FULL_SHAPES
    tokens = SMALL_TOKENS if small else FULL_TOKENS
    size = SMALL_MATMUL if small else FULL_MATMUL
    result: dict[str, Any] = {
        "bf16_matmul_tflops": matmul_tflops(size, torch.bfloat16, device),
        "fp32_matmul_tflops": matmul_tflops(size, torch.float32, device),
        "shapes": [],
        "skipped": [],
    }
    # one small solve of each kind first: handles and kernels load outside the timings
    measure_shape("warm-up", 128, 128, 256, device, spec["seed"])
    previous: tuple[float, int] | None = None  # (seconds, out * in^2) of the last shape
    for name, out_features, in_features in shapes:
        cost = out_features * in_features**2
        if previous is not None and not deadline.allows(previous[0] * cost / previous[1]):
            result["skipped"].append(name)
            continue
        started = deadline.elapsed_s()
        result["shapes"].append(
            measure_shape(name, out_features, in_features, tokens, device, spec["seed"])
        )
        previous = (deadline.elapsed_s() - started, cost)
        save(result)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result
