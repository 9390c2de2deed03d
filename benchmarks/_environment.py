"""What decides a measurement besides the code: library versions, torch's build, threads, BLAS.

Standard library only at import, like ``_worker.py``: the workers under ``_reference/`` (the
llm-compressor venv, nothing from llmc-trace) describe themselves with the same function, so
the two tools' descriptions compare field by field. Call it in the measuring process, after
torch's threads are set: it reports what that process runs with, not what another would.
"""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

SAME_FOR_A_RATIO = ("torch", "torch_git", "transformers")
"""Fields that must agree before two tools' seconds are compared: both trace and run the same
model code on the same kernels only then."""


def describe(packages: list[str]) -> dict[str, Any]:
    """This process's versions of `packages` (those installed), Python, torch (version, commit,
    threads, BLAS, CPU capability) and transformers."""
    import torch
    import transformers

    config = torch.__config__.show()
    lines = [line.strip(" -") for line in config.splitlines()]
    blas_info = next(
        (part.split("=", 1)[1] for part in config.replace(",", " ").split()
         if part.startswith("BLAS_INFO=")),
        "none",
    )  # fmt: skip
    library = next(
        (line for line in lines if "Math Kernel Library" in line or "OpenBLAS" in line), ""
    )
    capability = next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("CPU capability")),
        "",
    )
    installed = {}
    for name in packages:
        try:
            installed[name] = version(name)
        except PackageNotFoundError:
            continue
    return {
        "packages": installed,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "blas": f"{blas_info}: {library}" if library else blas_info,
        "cpu_capability": capability,
        "transformers": transformers.__version__,
    }


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded for printing."""
    return [round(x, 2) for x in os.getloadavg()]


def environment_line(label: str, run: dict[str, Any]) -> str | None:
    """One line saying what ``run`` (a worker's result) ran with and the load around it;
    ``None`` for a run that recorded no environment (it failed before)."""
    if not run or "environment" not in run:
        return None
    e = run["environment"]
    packages = ", ".join(f"{k} {v}" for k, v in e["packages"].items())
    return (
        f"{label}: {packages}; Python {e['python']}; torch {e['torch']} "
        f"({e['torch_git'][:10]}, {e['threads']} threads, {e['interop_threads']} "
        f"interop, BLAS {e['blas']}, {e['cpu_capability']}); transformers "
        f"{e['transformers']}; load {run['load_before']} -> {run.get('load_after', '-')}"
    )
