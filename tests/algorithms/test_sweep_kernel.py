"""GPTQ's block sweep as one kernel against the torch loop it replaces: on the CPU through
Triton's interpreter (the same integers, bit for bit: run by ``test_interpreted_kernels.py``),
and on a GPU compiled."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import torch

from llmc_trace.algorithms import QuantizationArgs, gptq
from llmc_trace.core.solver import SolverSettings
from llmc_trace.algorithms.gptq import GPTQResult
from llmc_trace.algorithms.grid import SweepGrid
from llmc_trace.algorithms import sweep_kernel
from llmc_trace.algorithms.sweep_kernel import kernel_sweeps

pytest.importorskip("triton")

GPTQ_MODULE = sys.modules["llmc_trace.algorithms.gptq"]

CASES = {
    "channel": (QuantizationArgs(num_bits=4, strategy="channel", group_size=None), False),
    "group-asym": (QuantizationArgs(num_bits=4, group_size=64, symmetric=False), False),
    "group-actorder": (QuantizationArgs(num_bits=4, group_size=64, actorder="static"), False),
    "3bit-held-zeros": (QuantizationArgs(num_bits=3, group_size=64, symmetric=False), True),
}


def _problem(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weight whose rows are not a multiple of the kernel's tile, inputs whose columns differ
    in scale (act-order has an order to find), and a pruning mask."""
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(40, 192, generator=generator) * 0.02
    X = torch.randn(768, 192, generator=generator) * torch.linspace(0.2, 3.0, 192)
    zeros = torch.rand(40, 192, generator=generator) < 0.3
    return W.to(device), (2 * X.T @ X / 768).to(device), zeros.to(device)


def _counting_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The blocks the kernel swept, recorded as `gptq` calls it."""
    launched: list[int] = []
    kernel = GPTQ_MODULE.sweep_block

    def counted(grid: SweepGrid, i1: int, *buffers: torch.Tensor) -> None:
        launched.append(i1)
        kernel(grid, i1, *buffers)

    monkeypatch.setattr(GPTQ_MODULE, "sweep_block", counted)
    return launched


def _swept_both_ways(device: str) -> Iterator[tuple[str, Swept]]:
    """Each case's GPTQ through the kernel, then through the torch loop, on `device`."""
    for case, (args, held) in CASES.items():
        W, H, zeros = _problem(device)
        kwargs = {"zeros": zeros} if held else {}
        with pytest.MonkeyPatch.context() as monkeypatch:
            launched = _counting_launches(monkeypatch)
            kernel = gptq(W, H, args, **kwargs, settings=SolverSettings(blocksize=96))
            monkeypatch.setattr(GPTQ_MODULE, "kernel_sweeps", lambda grid, device: False)
            loop = gptq(W, H, args, **kwargs, settings=SolverSettings(blocksize=96))
        yield case, Swept(launched, kernel, loop, zeros if held else None)


class Swept(NamedTuple):
    launched: list[int]  # the blocks the kernel swept
    kernel: GPTQResult
    loop: GPTQResult
    held: torch.Tensor | None  # the weights held at zero, where the case holds some


def compare_on_the_cpu() -> dict[str, dict[str, object]]:
    """Each case swept by the interpreted kernel and by the torch loop: what the test checks.
    Runs in a process started with `TRITON_INTERPRET=1` (Triton reads it when first imported)."""
    results: dict[str, dict[str, object]] = {}
    for case, (launched, kernel, loop, held) in _swept_both_ways("cpu"):
        results[case] = {
            "launched": launched,
            "same_integers": torch.equal(kernel.quantized.int_weight, loop.quantized.int_weight),
            "same_scales": torch.equal(kernel.quantized.scale, loop.quantized.scale),
            "losses": [kernel.loss, loop.loss],
            "held_at_zero": None
            if held is None
            else bool((kernel.quantized.weight[held] == 0).all()),
        }
    return results


def check_interpreted(results: dict[str, dict[str, object]]) -> None:
    """What :func:`compare_on_the_cpu` found, in a process with Triton's interpreter, checked
    (``tests/algorithms/test_interpreted_kernels.py`` starts that process)."""
    assert set(results) == set(CASES)
    for case, result in results.items():
        assert result["launched"] == [0, 96], case  # each block in one launch, none by the loop
        assert result["same_integers"] and result["same_scales"], case
        assert result["losses"][0] == pytest.approx(result["losses"][1], rel=1e-6), case
        assert result["held_at_zero"] is not False, case


def test_scales_fitted_in_the_sweep_stay_on_the_torch_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group fitted when the sweep reaches it needs its columns as the sweep updated them,
    which the kernel does not fit: those sweeps keep the loop, and so does a CPU without the
    interpreter."""
    W, _, _ = _problem("cpu")
    args = QuantizationArgs(num_bits=4, group_size=64)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # which grids take the kernel, whatever this environment's interpreter can run
    monkeypatch.setattr(sweep_kernel, "_FALLBACK", sweep_kernel._Fallback())
    monkeypatch.setattr(sweep_kernel, "interpreter_problem", lambda: None)
    fitted_in_sweep = SweepGrid(W, args, perm=None, static_groups=False, scale_dtype=W.dtype)
    fitted_up_front = SweepGrid(W, args, perm=None, static_groups=True, scale_dtype=W.dtype)
    assert not kernel_sweeps(fitted_in_sweep, W.device)
    assert kernel_sweeps(fitted_up_front, W.device)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not kernel_sweeps(fitted_up_front, W.device)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernel_agrees_with_the_torch_loop_on_the_gpu() -> None:
    """On one GPU both sweeps share the factor and the block products; only the rank-1
    updates' rounding can differ (the torch loop's may fuse multiply and add)."""
    for case, (launched, kernel, loop, _) in _swept_both_ways("cuda"):
        assert launched == [0, 96], case
        mismatched = (kernel.quantized.int_weight != loop.quantized.int_weight).float().mean()
        assert mismatched < 1e-3, f"{case}: {mismatched.item():.4%} of the integers differ"
        assert kernel.loss == pytest.approx(loop.loss, rel=1e-4), case
