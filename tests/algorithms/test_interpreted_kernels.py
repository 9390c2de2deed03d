"""GPTQ's and SparseGPT's sweep kernels against their torch loops on the CPU, through Triton's
interpreter: one process started with ``TRITON_INTERPRET=1`` (Triton reads it when first
imported) runs both comparisons, since its imports cost more than the interpreted sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

import test_prune_kernel  # noqa: E402
import test_sweep_kernel  # noqa: E402

from llmc_trace.algorithms.sweep_kernel import interpreter_problem  # noqa: E402

HERE = Path(__file__).parent
COMPARE = (
    "import json, test_prune_kernel, test_sweep_kernel\n"
    "print(json.dumps({'gptq': test_sweep_kernel.compare_on_the_cpu(),"
    " 'sparsegpt': test_prune_kernel.compare_on_the_cpu()}))\n"
)


@pytest.mark.slow
def test_the_interpreted_kernels_choose_what_the_torch_loops_choose() -> None:
    """GPTQ: the torch loop's integers and scales; SparseGPT: its mask, weights and integers,
    bit for bit, each block in one launch. Skipped where this Triton's interpreter cannot run
    with this numpy (`test_kernel_fallback.py` holds what the sweeps do there)."""
    if (problem := interpreter_problem()) is not None:
        pytest.skip(problem)
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", COMPARE], capture_output=True, text=True, timeout=300, cwd=HERE,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout.splitlines()[-1])
    test_sweep_kernel.check_interpreted(results["gptq"])
    test_prune_kernel.check_interpreted(results["sparsegpt"])
