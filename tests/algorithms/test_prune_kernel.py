"""SparseGPT's mask-and-sweep as one kernel against the torch loop it replaces: on the CPU
through Triton's interpreter (the same mask and weights, bit for bit: run by
``test_interpreted_kernels.py``), and on a GPU compiled."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import torch

from llmc_trace.algorithms import QuantizationArgs, sparsegpt
from llmc_trace.algorithms.sparsegpt import SparseGPTResult, Sparsity
from llmc_trace.core.solver import SolverSettings

pytest.importorskip("triton")

SPARSEGPT_MODULE = sys.modules["llmc_trace.algorithms.sparsegpt"]

#: case -> (sparsity, quantization, weights drawn from few levels: N:M scores that tie)
CASES: dict[str, tuple[Sparsity, QuantizationArgs | None, bool]] = {
    "50%": (0.5, None, False),
    "2:4": ((2, 4), None, False),
    "2:4-ties": ((2, 4), None, True),
    "1:4-w4-channel-asym": (
        (1, 4),
        QuantizationArgs(num_bits=4, strategy="channel", group_size=None, symmetric=False),
        False,
    ),
    "60%-w4-channel": (
        0.6,
        QuantizationArgs(num_bits=4, strategy="channel", group_size=None),
        False,
    ),
}


def _problem(device: str, ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight whose rows are not a multiple of the kernel's tile, and inputs whose columns
    differ in scale; with `ties`, weights of a few levels, so runs hold equal scores."""
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(40, 64, generator=generator) * 0.02
    if ties:
        W = torch.round(W / 0.01) * 0.01
    X = torch.randn(256, 64, generator=generator) * torch.linspace(0.2, 3.0, 64)
    return W.to(device), (2 * X.T @ X / 256).to(device)


class Swept(NamedTuple):
    launched: list[int]  # the blocks the kernel swept
    kernel: SparseGPTResult
    loop: SparseGPTResult


def _swept_both_ways(device: str) -> Iterator[tuple[str, Swept]]:
    """Each case's SparseGPT through the kernel, then through the torch loop, on `device`.
    A problem with ties is not damped, so that equal weights keep equal scores."""
    for case, (sparsity, args, ties) in CASES.items():
        W, H = _problem(device, ties)
        settings = SolverSettings(blocksize=32)
        launched: list[int] = []

        def counted(
            *arguments: object, kernel=SPARSEGPT_MODULE.prune_block, launched=launched
        ) -> bool:
            launched.append(arguments[6])  # i1
            return kernel(*arguments)

        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(SPARSEGPT_MODULE, "prune_block", counted)
            through_kernel = sparsegpt(W, H, sparsity, quantize=args, settings=settings)
            monkeypatch.setattr(SPARSEGPT_MODULE, "kernel_sweeps", lambda grid, device: False)
            loop = sparsegpt(W, H, sparsity, quantize=args, settings=settings)
        yield case, Swept(launched, through_kernel, loop)


def compare_on_the_cpu() -> dict[str, dict[str, object]]:
    """Each case pruned by the interpreted kernel and by the torch loop: what the test checks.
    Runs in a process started with `TRITON_INTERPRET=1` (Triton reads it when first imported)."""
    results: dict[str, dict[str, object]] = {}
    for case, (launched, kernel, loop) in _swept_both_ways("cpu"):
        sparsity = CASES[case][0]
        runs = kernel.pruned.reshape(kernel.pruned.shape[0], -1, 4).sum(-1)
        quantized = kernel.quantized is not None and loop.quantized is not None
        results[case] = {
            "launched": launched,
            "same_mask": torch.equal(kernel.pruned, loop.pruned),
            "same_weight": torch.equal(kernel.weight, loop.weight),
            "same_integers": None
            if not quantized
            else torch.equal(kernel.quantized.int_weight, loop.quantized.int_weight),
            "losses": [kernel.loss, loop.loss],
            "pruned": int(kernel.pruned.sum()),
            "pattern_holds": bool((runs == 4 - sparsity[0]).all())
            if isinstance(sparsity, tuple)
            else None,
            "tied_runs": _tied_runs(case),
        }
    return results


def _tied_runs(case: str) -> int:
    """How many runs of 4 of the first block's first column group hold two equal weights as
    the sweep starts (the ties case must have some for the tie-break to be checked)."""
    W, _ = _problem("cpu", CASES[case][2])
    runs = W[:, :4].abs()
    return int((runs.unsqueeze(-1) == runs.unsqueeze(-2)).sum(dim=(-1, -2)).gt(4).sum())


def check_interpreted(results: dict[str, dict[str, object]]) -> None:
    """What :func:`compare_on_the_cpu` found, in a process with Triton's interpreter, checked
    (``tests/algorithms/test_interpreted_kernels.py`` starts that process)."""
    assert set(results) == set(CASES)
    for case, result in results.items():
        assert result["launched"] == [0, 32], case  # each block in one launch, none by the loop
        assert result["same_mask"] and result["same_weight"], case
        assert result["same_integers"] is not False, case
        assert result["losses"][0] == pytest.approx(result["losses"][1], rel=1e-6), case
        assert result["pattern_holds"] is not False, case
    assert results["50%"]["pruned"] == 40 * 64 // 2
    assert results["2:4-ties"]["tied_runs"] > 5  # the stable choice among equal scores is checked


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernel_agrees_with_the_torch_loop_on_the_gpu() -> None:
    """On one GPU both sweeps share the factor and the block products; only the rank-1
    updates' rounding can differ (the torch loop's may fuse multiply and add), which may move
    a weight near a run's threshold: under 1 % of the mask may differ."""
    for case, (launched, kernel, loop) in _swept_both_ways("cuda"):
        assert launched == [0, 32], case
        mismatched = (kernel.pruned != loop.pruned).float().mean()
        assert mismatched < 1e-2, f"{case}: {mismatched.item():.4%} of the mask differs"
        assert kernel.loss == pytest.approx(loop.loss, rel=1e-3), case
