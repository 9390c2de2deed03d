"""Where the sweep kernel would run but cannot, GPTQ and SparseGPT sweep with the torch loop,
with one warning naming why: Triton missing, or the kernel failing to compile. Simulated on the
CPU: `TRITON_INTERPRET=1` makes the sweeps want the kernel, as a CUDA device does."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import torch

from llmc_trace.algorithms import QuantizationArgs, gptq, sparsegpt
from llmc_trace.algorithms import sweep_kernel
from llmc_trace.algorithms.sweep_kernel import (
    KernelFallbackWarning,
    _Fallback,
    interpreter_problem,
    kernel_fallback_reason,
)
from llmc_trace.core.solver import SolverSettings

GPTQ_MODULE = sys.modules["llmc_trace.algorithms.gptq"]
SPARSEGPT_MODULE = sys.modules["llmc_trace.algorithms.sparsegpt"]
ARGS = QuantizationArgs(num_bits=4, strategy="channel", group_size=None)
SETTINGS = SolverSettings(blocksize=32)


class FailingCompiler:
    """What `_kernel()` returns when Triton's compiler raises at the first launch."""

    def __getitem__(self, launch: object) -> object:
        def compile_and_launch(*args: object, **kwargs: object) -> None:
            raise RuntimeError("PassManager::run failed\n(the rest of the compiler's log)")

        return compile_and_launch


@pytest.fixture
def problem() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(24, 64, generator=generator) * 0.02
    X = torch.randn(256, 64, generator=generator)
    return W, 2 * X.T @ X / 256


@pytest.fixture
def wants_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has not yet decided about the kernel, on which the sweeps want it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(sweep_kernel, "_FALLBACK", _Fallback())


def _torch_loops(W: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ's integers and SparseGPT's 2:4 weight as the torch loops give them."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        for module in (GPTQ_MODULE, SPARSEGPT_MODULE):
            monkeypatch.setattr(module, "kernel_sweeps", lambda grid, device: False)
        return _both(W, H)


def _both(W: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    integers = gptq(W, H, ARGS, SETTINGS).quantized.int_weight
    return integers, sparsegpt(W, H, (2, 4), settings=SETTINGS).weight


def _swept_with_warnings(W: torch.Tensor, H: torch.Tensor) -> tuple[tuple, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = _both(W, H), _both(W, H)  # two sweeps of each kind, four blocks each
    messages = [str(w.message) for w in caught if issubclass(w.category, KernelFallbackWarning)]
    return results, messages


@pytest.mark.usefixtures("wants_the_kernel")
def test_triton_missing_sweeps_with_torch_after_one_warning(
    problem: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    W, H = problem
    expected = _torch_loops(W, H)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.setattr(sweep_kernel, "_kernel", lambda: pytest.fail("the kernel was launched"))
    results, messages = _swept_with_warnings(W, H)
    assert len(messages) == 1, messages
    assert messages[0].startswith("Triton cannot be imported (")
    for result in results:
        assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])


@pytest.mark.usefixtures("wants_the_kernel")
def test_a_kernel_that_fails_to_compile_sweeps_with_torch_after_one_warning(
    problem: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    W, H = problem
    expected = _torch_loops(W, H)
    monkeypatch.setattr(sweep_kernel, "_triton_import_error", lambda: None)  # Triton imports
    monkeypatch.setattr(sweep_kernel, "interpreter_problem", lambda: None)  # and would run
    compiles: list[int] = []

    def failing() -> FailingCompiler:
        compiles.append(1)
        return FailingCompiler()

    monkeypatch.setattr(sweep_kernel, "_kernel", failing)
    results, messages = _swept_with_warnings(W, H)
    assert compiles == [1]  # tried once in the process, by GPTQ's first block; never again
    assert messages == [
        "the Triton sweep kernel failed to compile (RuntimeError: PassManager::run failed): "
        "GPTQ and SparseGPT sweep each block with torch ops instead of one Triton kernel (the "
        "same results, several times slower on a GPU); install the Triton release that matches "
        "this torch to use the kernel."
    ]
    for result in results:
        assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])


@pytest.mark.usefixtures("wants_the_kernel")
def test_an_interpreter_that_cannot_run_with_this_numpy_is_named_before_any_launch(
    problem: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton 3.6 (torch 2.11's) and numpy 2.4: the interpreter would fail inside the
    kernel's first loop; the sweeps say why before launching it, with what runs it instead."""
    triton = pytest.importorskip("triton")
    W, H = problem
    expected = _torch_loops(W, H)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(np, "__version__", "2.4.0")
    monkeypatch.setattr(sweep_kernel, "_kernel", lambda: pytest.fail("the kernel was launched"))
    results, messages = _swept_with_warnings(W, H)
    reason = (
        "Triton 3.6.0's interpreter cannot run the sweep kernel with numpy 2.4.0 (it turns the "
        "kernel's scalar arguments into one-element arrays, which numpy 2.4 and later refuse to "
        "convert to integers)"
    )
    assert messages == [
        f"{reason}: GPTQ and SparseGPT sweep each block with torch ops instead of one Triton "
        "kernel (the same results, several times slower on a GPU); Triton 3.7 or later, or "
        "numpy before 2.4, runs the kernel through the interpreter."
    ]
    assert kernel_fallback_reason() == reason
    for result in results:
        assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])


@pytest.mark.parametrize(
    ("triton_version", "numpy_version"),
    [("3.7.0", "2.5.2"), ("3.6.0", "2.3.5"), ("3.9.0", "2.4.6")],
)
def test_an_interpreter_that_runs_with_this_numpy_is_not_refused(
    triton_version: str, numpy_version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(triton, "__version__", triton_version)
    monkeypatch.setattr(np, "__version__", numpy_version)
    assert interpreter_problem() is None


def test_a_cpu_without_the_interpreter_never_asks_for_triton(
    problem: tuple[torch.Tensor, torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    W, H = problem
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(sweep_kernel, "_FALLBACK", _Fallback())
    monkeypatch.setitem(sys.modules, "triton", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        _both(W, H)
    assert sweep_kernel._FALLBACK.reason is None
