"""Every benchmark's figures as a file: what ran, where, on what, and what it measured.

A benchmark ends by writing one JSON document under ``benchmarks/results/`` (committed), so a
figure in the docs can be traced to the run that made it and that run repeated: the command
line as typed from the repository's root, the commit (``+dirty`` when tracked files differed
from it), the date, the machine (CPU model, cores, memory, GPU), the measuring process's
library versions and threads (``_environment.describe``), the load average before and after,
the figures themselves, and each goal the benchmark judges with its verdict.
``benchmarks/tables.py`` renders the docs' tables from these files and nothing else.

A timing is never one run: ``spread`` keeps every repeat with its median, minimum and maximum,
and a ratio between two tools is taken from figures of the same run.

Standard library only at import, like ``_environment.py``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from _environment import describe, load_average

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
SCHEMA = "llmc-trace/benchmark-result"
VERSION = 1
#: Packages whose versions every result records (those installed in the measuring process).
PACKAGES = ["llmc-trace", "torch", "transformers", "compressed-tensors", "numpy"]


def spread(values: Iterable[float], digits: int = 4) -> dict[str, Any]:
    """Repeats of one measurement: every value, and the median with the min-max range."""
    values = [round(float(v), digits) for v in values]
    if not values:
        raise ValueError("spread() needs at least one value")
    return {
        "median": round(statistics.median(values), digits),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
        "values": values,
    }


def spread_text(s: dict[str, Any] | None, fmt: str = ".1f") -> str:
    """``median (min-max)``, or the one value when the runs agree or there was one run."""
    if not s:
        return "-"
    if s["runs"] == 1 or s["min"] == s["max"]:
        return format(s["median"], fmt)
    return f"{format(s['median'], fmt)} ({format(s['min'], fmt)}-{format(s['max'], fmt)})"


def goal(name: str, target: str, figure: str, met: bool) -> dict[str, Any]:
    """One goal as the benchmark judged it: what it asks, the figure, met or missed."""
    return {"goal": name, "target": target, "figure": figure, "verdict": "met" if met else "missed"}


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that reruns this benchmark from the repository's root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        shown = script.relative_to(ROOT).as_posix()
    except ValueError:
        shown = argv[0]
    return shlex.join(["python", shown, *argv[1:]])


#: Tracked paths benchmarks write: results, and the coverage sweep that ships with the package
#: (``coverage_all.py`` rewrites it). A change there is the run's output, not a dirty tree.
OUTPUTS = ("benchmarks/results/", "src/llmc_trace/models/builtin/coverage-all.json")


def commit() -> str:
    """HEAD's hash, with ``+dirty`` when tracked files other than :data:`OUTPUTS` differ
    from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.rstrip("\n")  # a status line's leading blank is its first column

    head = git("rev-parse", "HEAD") or "unknown"
    changed = [
        line for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
        if not line[3:].startswith(OUTPUTS)
    ]  # fmt: skip
    return head + ("+dirty" if changed else "")


def machine() -> dict[str, Any]:
    """The hardware: CPU model, logical cores, memory, and the GPU where torch sees one."""
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    gpu = None
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": gpu,
        "system": f"{platform.system()} {platform.release()}",
    }


class Run:
    """One benchmark run, opened at its start (load average, date) and written at its end.

    ``Run("compress_scale")`` then, once the figures are in, ``run.write(figures, goals=...)``:
    the file lands at ``benchmarks/results/compress_scale.json`` (or ``path``), replaced whole
    (written beside it, then renamed), so an interrupted run leaves the committed file as it was.
    """

    def __init__(self, name: str, argv: Sequence[str] | None = None) -> None:
        self.name = name
        self.command = command_line(argv)
        self.started = _dt.datetime.now(_dt.UTC)
        self.load_before = load_average()

    def write(
        self,
        figures: dict[str, Any],
        *,
        goals: Sequence[dict[str, Any]] = (),
        environments: dict[str, Any] | None = None,
        notes: Sequence[str] = (),
        path: Path | None = None,
        packages: Sequence[str] = (),
    ) -> Path:
        """Write the result file and return its path. ``environments``: what other processes
        (a reference tool's workers) ran with, keyed by their name; ``notes``: sentences the
        docs print under the table, facts of this run only."""
        ended = _dt.datetime.now(_dt.UTC)
        document = {
            "schema": SCHEMA,
            "version": VERSION,
            "benchmark": self.name,
            "command": self.command,
            "commit": commit(),
            "date": self.started.strftime("%Y-%m-%d"),
            "started": self.started.isoformat(timespec="seconds"),
            "wall_s": round((ended - self.started).total_seconds(), 1),
            "machine": machine(),
            "environment": describe([*PACKAGES, *packages]),
            "environments": environments or {},
            "load_average": {"before": self.load_before, "after": load_average()},
            "figures": figures,
            "goals": list(goals),
            "notes": list(notes),
        }
        path = path or RESULTS / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.partial")
        staging.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
        staging.replace(path)
        print(f"result written: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return path


def read(name: str) -> dict[str, Any]:
    """The committed result ``benchmarks/results/<name>.json``."""
    document = json.loads((RESULTS / f"{name}.json").read_text())
    if document.get("schema") != SCHEMA:
        raise ValueError(f"{name}.json is not a {SCHEMA} document")
    return document
