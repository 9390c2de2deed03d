"""Serve llmc-trace's checkpoints with vLLM and compare its perplexity with ours, same rows.

For every scheme and method the project writes, the reference model (``refmodel/``) is
compressed with ``llmc-trace compress`` (as a user runs it), scored by ``llmc-trace``'s
evaluator and by vLLM's offline ``LLM`` (``prompt_logprobs``) on the first evaluation rows,
each checkpoint in a fresh vLLM process (``_reference/serve_vllm.py`` in
``benchmarks/.venv-vllm``, made by ``benchmarks/vllm_env.sh``). A row of the table:

* ``agrees``: vLLM served it and its perplexity is within ``--tolerance`` (0.1 %) of ours;
* ``no kernel here; reference agrees``: this machine's vLLM has no kernel for the scheme (the
  reason is printed), so it was served again with vLLM's own model, parameters and loaders and
  a reference dequantizing kernel (see the worker's docstring), and that agrees;
* ``DISAGREES`` / ``REFUSED``: the check fails (exit status 1).

Two tampered copies of the W4A16 checkpoint, one tensor renamed and the packing order of
``weight_packed`` reversed, must fail the same check (``expected to fail``); a tampered copy
that passes fails the run, so the check is shown able to fail every time it runs.

    bash benchmarks/vllm_env.sh
    python benchmarks/vllm_serving.py            # every scheme, 32 x 512 calibration
    python benchmarks/vllm_serving.py --ci       # what .ci/run runs: fewer samples
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
#: The venv ``vllm_env.sh`` makes (``LLMC_VLLM_VENV`` moves it, as CI does to keep it).
VENV = Path(os.environ.get("LLMC_VLLM_VENV") or ROOT / "benchmarks" / ".venv-vllm")
VENV_PYTHON = VENV / "bin" / "python"
WORKER = ROOT / "benchmarks" / "_reference" / "serve_vllm.py"
REFMODEL = ROOT / "refmodel"
#: What vLLM's CPU build says (in its worker's log) when it has no kernel for a scheme.
NO_KERNEL_MARKERS = ("Failed to find a kernel", "cpu_gemm_wna16", "not supported on CPU")


@dataclass(frozen=True)
class Case:
    """One checkpoint: how ``llmc-trace compress`` makes it (flags), or a tampering of another."""

    name: str
    flags: tuple[str, ...] = ()
    recipe: str | None = None
    tamper: str | None = None  # "rename" or "reverse-packing", applied to the W4A16 checkpoint
    in_ci: bool = True

    @property
    def expected_to_fail(self) -> bool:
        return self.tamper is not None


TWO_STAGES = """\
stages:
  - {method: sparsegpt, sparsity: 2:4}
  - {method: gptq, scheme: W4A16}
"""

CASES = (
    Case("original (bf16)"),
    Case("GPTQ W4A16", ("--scheme", "W4A16")),
    Case("GPTQ W4A16_ASYM", ("--scheme", "W4A16_ASYM"), in_ci=False),
    Case("GPTQ W8A16", ("--scheme", "W8A16")),
    Case("GPTQ W8A8", ("--scheme", "W8A8")),
    Case("SparseGPT 50 %", ("--method", "sparsegpt", "--sparsity", "0.5", "--scheme", "none")),
    Case("SparseGPT 2:4", ("--method", "sparsegpt", "--sparsity", "2:4", "--scheme", "none")),
    Case("SparseGPT 2:4 then GPTQ W4A16", recipe=TWO_STAGES, in_ci=False),
    Case("W4A16, one tensor renamed", tamper="rename"),
    Case("W4A16, packing order reversed", tamper="reverse-packing"),
)


@dataclass
class Row:
    case: Case
    ours: float | None = None
    vllm: float | None = None
    verdict: str = ""
    detail: str = ""
    numbers: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        agreed = self.verdict.startswith("agrees") or self.verdict.endswith("reference agrees")
        return agreed != self.case.expected_to_fail


def compress(case: Case, out: Path, samples: int) -> float:
    """``llmc-trace compress`` on the reference model; returns its seconds."""
    command = [
        str(Path(sys.executable).parent / "llmc-trace"), "compress", "--model", str(REFMODEL),
        "--dataset", str(REFMODEL / "calib.npy"), "--samples", str(samples),
        "--seq-len", "512", "--out", str(out), "--overwrite", *case.flags,
    ]  # fmt: skip
    if case.recipe is not None:
        recipe = out.parent / f"{out.name}.yaml"
        recipe.write_text(case.recipe)
        command += ["--recipe", str(recipe)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def tamper(source: Path, out: Path, how: str) -> None:
    """A copy of ``source`` with one tensor renamed, or every ``weight_packed`` int32 holding
    its eight 4-bit values in reverse order (shapes and dtypes unchanged)."""
    shutil.copytree(source, out, dirs_exist_ok=True)
    for shard in sorted(out.glob("*.safetensors")):
        tensors = load_file(shard)
        if how == "rename":
            name = next(n for n in sorted(tensors) if n.endswith("weight_scale"))
            tensors[name.replace("weight_scale", "weight_scales")] = tensors.pop(name)
        else:
            for name in [n for n in tensors if n.endswith("weight_packed")]:
                tensors[name] = reverse_nibbles(tensors[name])
        save_file(tensors, shard, metadata={"format": "pt"})
        if how == "rename":
            return  # one tensor is enough


def reverse_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Each int32's eight 4-bit fields in reverse order."""
    value = packed.to(torch.int64) & 0xFFFFFFFF
    fields = [(value >> (4 * i)) & 0xF for i in range(8)]
    reversed_value = sum(field << (4 * (7 - i)) for i, field in enumerate(fields))
    return torch.where(reversed_value >= 2**31, reversed_value - 2**32, reversed_value).to(
        torch.int32
    )


def our_perplexity(folder: Path, rows: int) -> float:
    from llmc_trace.evaluate.run import evaluate_model

    return evaluate_model(folder, REFMODEL / "eval.npy", samples=rows).perplexity


def serve(folder: Path, rows: int, reference_kernel: bool) -> tuple[dict, str]:
    """One fresh vLLM process on ``folder``; its RESULT and its whole log."""
    command = [str(VENV_PYTHON), str(WORKER), str(folder), str(REFMODEL / "eval.npy")]
    command += ["--rows", str(rows)] + (["--reference-kernel"] if reference_kernel else [])
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    log = done.stdout + done.stderr
    line = next((x for x in log.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"ok": False, "error": f"the worker exited {done.returncode} without a result"}, log
    return json.loads(line.removeprefix("RESULT ")), log


def no_kernel_reason(log: str) -> str | None:
    """vLLM's own words for a missing kernel, when its log has them."""
    lines = [
        x
        for x in log.splitlines()
        if any(marker in x for marker in NO_KERNEL_MARKERS) and not x.startswith("RESULT ")
    ]
    errors = [x for x in lines if "Error" in x] or lines
    return errors[0].split("] ")[-1].strip()[:200] if errors else None


def root_cause(log: str, fallback: str) -> str:
    """The first exception line of vLLM's worker log (the engine's own error only says that
    initialization failed)."""
    generic = ("EngineDeadError", "Engine core initialization failed", "Worker failed with")
    for line in log.splitlines():
        text = line.split("] ")[-1].strip()
        if "Error: " in text and not any(g in text for g in generic):
            return text[:300]
    return fallback


def judge(row: Row, folder: Path, rows: int, tolerance: float) -> None:
    """Serve ``folder`` and fill ``row`` with vLLM's perplexity and the verdict."""
    result, log = serve(folder, rows, reference_kernel=False)
    # the engine runs in the worker's process: vLLM's reason is its exception, or in its log
    reason = None if result["ok"] else no_kernel_reason(f"{result['error']}\n{log}")
    if reason is not None:
        result, log = serve(folder, rows, reference_kernel=True)
    if not result["ok"]:
        row.verdict, row.detail = "REFUSED", root_cause(log, result["error"])
        return
    row.vllm = float(result["perplexity"])
    row.numbers = {"load_s": result["load_s"], "tokens_per_s": result["tokens_per_s"]}
    difference = abs(row.vllm - row.ours) / row.ours
    row.numbers["difference"] = difference
    if difference > tolerance:
        row.verdict = "DISAGREES"
    else:
        row.verdict = "agrees" if reason is None else "no kernel here; reference agrees"
    row.detail = reason or ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the cases and sizes CI runs")
    parser.add_argument("--samples", type=int, help="calibration rows (default 32; 8 with --ci)")
    parser.add_argument("--rows", type=int, default=16, help="evaluation rows scored")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, 1e-3 = 0.1 %%")
    args = parser.parse_args()
    if not VENV_PYTHON.exists():
        print(f"{VENV_PYTHON} is missing: run `bash benchmarks/vllm_env.sh` first.")
        return 2
    samples = args.samples or (8 if args.ci else 32)
    cases = [case for case in CASES if case.in_ci or not args.ci]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch:
        folders: dict[str, Path] = {}
        for case in cases:
            row = Row(case)
            folder = Path(scratch) / f"case{len(rows)}"
            if case.tamper is not None:
                tamper(folders["GPTQ W4A16"], folder, case.tamper)
            elif case.flags or case.recipe:
                row.numbers["compress_s"] = compress(case, folder, samples)
            else:
                folder = REFMODEL
            folders[case.name] = folder
            row.ours = our_perplexity(folder, args.rows) if case.tamper is None else None
            if row.ours is None:  # a tampered copy is judged against its untouched original
                row.ours = rows[[r.case.name for r in rows].index("GPTQ W4A16")].ours
            judge(row, folder, args.rows, args.tolerance)
            rows.append(row)
            print(format_row(row), flush=True)
    print_table(rows, samples, args.rows)
    failed = [row for row in rows if not row.passed]
    for row in failed:
        print(f"FAILED: {row.case.name}: {row.verdict} {row.detail}")
    return 1 if failed else 0


def format_row(row: Row) -> str:
    vllm = f"{row.vllm:.4f}" if row.vllm is not None else "-"
    difference = row.numbers.get("difference")
    gap = (
        f"{100 * difference:.3f} %" if difference is not None and math.isfinite(difference) else ""
    )
    expected = " (expected to fail)" if row.case.expected_to_fail else ""
    return (
        f"| {row.case.name} | {vllm} | {row.ours:.4f} | {gap} | {row.verdict}{expected} "
        f"| {row.numbers.get('load_s', float('nan')):.1f} "
        f"| {row.numbers.get('tokens_per_s', float('nan')):.0f} | {row.detail} |"
    )


def print_table(rows: list[Row], samples: int, scored: int) -> None:
    print(
        f"\nrefmodel, calibration {samples} x 512, perplexity on the first {scored} eval rows"
        f" (torch {torch.__version__}, numpy {np.__version__})"
    )
    print("| checkpoint | vLLM | llmc-trace evaluate | gap | verdict | load s | tokens/s | note |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(format_row(row))


if __name__ == "__main__":
    sys.exit(main())
