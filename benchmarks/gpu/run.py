"""The GPU run: install the carried wheels, then test and measure the CUDA path in 8 minutes.

On the GPU machine (see ``README.md`` beside this file for the device call)::

    python3 benchmarks/gpu/run.py --out "$OUT"

Here, on the CPU, the same steps with tiny shapes, in under a minute (what CI runs)::

    python benchmarks/gpu/run.py --dry-run --out out/gpu-dry-run

In order, each with its share of the time budget (``--budget-s``, 480 s: the issue's 8 minutes
on an H100):

1. ``install``: the wheels of ``benchmarks/gpu/wheels/`` (``wheels.py`` builds them) into a
   target folder put first on ``PYTHONPATH``, with no registry; refused when they were built
   from other sources than the ones beside this file.
2. ``versions``: what runs: each package's version and location, the device, the carried
   wheels' unmet requirements (``versions.py``).
3. ``cuda_tests``: the suite's tests a machine without CUDA skips (``cuda_selection.py``).
4. ``kernels``: per-layer GPTQ and SparseGPT against their matrix-product floor on every
   Llama-3-8B and -70B projection, medians of 5, and the Hessian's rate against the device's
   matrix peak (``kernel_speed.py``).
5. ``refmodel``: the reference model compressed on the CPU and on the device, perplexities
   side by side (``reference_model.py``).
6. ``llama``: ``compress`` of an 8B-shaped random Llama, streamed, with as many calibration
   tokens as the rest of the budget holds, up to 512 x 2048, seconds and device peaks per
   phase against the plan's; then without error propagation when the budget holds it
   (``llama.py``, ``phases.py``).

Each step runs in a process of its own with a hard timeout, so one that fails or hangs costs
its share and no more (with ``--small`` the measuring steps share one process: on two CPU
cores, each process's imports would cost more than its work). After every step the whole
record is rewritten: ``gpu-benchmark.json`` (one JSON, stable keys) and ``summary.txt`` (a
short table) in ``--out``; logs in ``steps.log``.

This file uses the standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from summary import goals, header, render  # noqa: E402
from wheels import source_digest  # noqa: E402

DEFAULT_WHEELS = HERE / "wheels"
#: each step's share of the budget; ``llama`` takes what is left when it starts
SHARES = {"versions": 0.03, "cuda_tests": 0.15, "kernels": 0.27, "refmodel": 0.1}
MEASURING = ("kernels", "refmodel", "llama")
#: seconds past a step's budget before its process is killed: the budget is the step's own
#: target (it stops starting work it cannot finish), the kill only guards against a hang
GRACE_S = 15.0
FULL_BUDGET_S, SMALL_BUDGET_S = 480.0, 120.0
#: what a test file holding a CUDA test contains
CUDA_TEST = re.compile(r"mark\.cuda\b|cuda\.is_available\(")


class Run:
    """One run's settings, clock and record."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out.resolve()
        self.work: Path = args.work.resolve()
        self.start = time.perf_counter()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.record: dict[str, Any] = {
            "schema": "llmc-trace/gpu-benchmark",
            "version": 1,
            "mode": "small" if args.small else "full",
            "device": args.device,
            "budget_s": args.budget_s,
            "command": shlex.join(["python3", "benchmarks/gpu/run.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "steps": {},
        }
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = (self.out / "steps.log").open("w")

    def left_s(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.start)

    def save(self) -> None:
        """Rewrite the JSON and the table from the record (each atomically)."""
        self.record["elapsed_s"] = time.perf_counter() - self.start
        self.record["goals"] = goals(self.record)
        for name, text in (
            ("gpu-benchmark.json", json.dumps(self.record, indent=1, sort_keys=True)),
            ("summary.txt", render(self.record)),
        ):
            partial = self.out / (name + ".partial")
            partial.write_text(text + "\n")
            os.replace(partial, self.out / name)

    def note(self, step: str, result: dict[str, Any]) -> None:
        self.record["steps"][step] = result
        self.save()
        status = result.get("status")
        elapsed = result.get("elapsed_s", 0.0)
        print(
            f"{step}: {status} in {elapsed:.1f} s (budget {result.get('budget_s', 0):.0f} s)",
            flush=True,
        )
        if result.get("error"):
            print(f"  {result['error']}")
        if step == "versions":  # what runs, before anything that might not finish
            print("\n".join(header(self.record)[:2]), flush=True)

    def child(self, command: list[str], timeout_s: float) -> tuple[int | None, float]:
        """Run ``command`` with its output in the log; (exit code or None on timeout, seconds)."""
        self.log.write(f"$ {' '.join(command)}\n")
        self.log.flush()
        start = time.perf_counter()
        try:
            code = subprocess.run(
                command,
                cwd=REPO,
                env=self.env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
        self.log.flush()
        return code, time.perf_counter() - start


def install(run: Run, wheels: Path, target: Path) -> dict[str, Any]:
    """Install every wheel of ``wheels`` into ``target`` with no index and no dependencies, and
    put ``target`` first on the path of every later step."""
    manifest = json.loads((wheels / "manifest.json").read_text())
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if manifest["python_version"] != here:
        raise SystemExit(
            f"the wheels in {wheels} are for Python {manifest['python_version']}, this is {here}: "
            f"rebuild them with python benchmarks/gpu/wheels.py --python-version {here}"
        )
    if manifest["source_digest"] != source_digest(REPO):
        raise SystemExit(
            f"the wheels in {wheels} were built from other sources than {REPO}'s: "
            "rebuild them (python benchmarks/gpu/wheels.py) before the run"
        )
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    command += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    command += [str(wheels / name) for name in sorted(manifest["wheels"])]
    code, seconds = run.child(command, 300)
    if code != 0:
        raise SystemExit(f"installing the wheels failed (exit {code}); see {run.out}/steps.log")
    path = [str(target), run.env.get("PYTHONPATH", "")]
    run.env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return {
        "status": "ok",
        "elapsed_s": seconds,
        "figures": {"wheels": sorted(manifest["wheels"]), "target": str(target)},
    }


def step_specs(run: Run, names: list[str], budgets: dict[str, float]) -> list[dict[str, Any]]:
    args = run.args
    return [
        {
            "name": name,
            "result": str(run.work / f"{name}.json"),
            "budget_s": budgets[name],
            "device": args.device,
            "small": args.small,
            "seed": 0,
            "work": str(run.work),
            "refmodel": str(REPO / "refmodel"),
            "target": str(args.target) if run.record["steps"].get("install") else None,
            "kernels_result": str(run.work / "kernels.json"),
            "no_propagate": args.no_propagate,
        }
        for name in names
    ]


def run_steps(run: Run, names: list[str], budgets: dict[str, float]) -> None:
    """``names`` in one process (``step.py``), killed ``GRACE_S`` after their budgets."""
    specs = step_specs(run, names, budgets)
    spec_path = run.work / f"spec-{names[0]}.json"
    spec_path.write_text(json.dumps({"steps": specs}, indent=1))
    for spec in specs:
        Path(spec["result"]).unlink(missing_ok=True)
    timeout = sum(budgets[n] for n in names) + GRACE_S
    code, _ = run.child([sys.executable, str(HERE / "step.py"), str(spec_path)], timeout)
    for spec in specs:
        path = Path(spec["result"])
        result = json.loads(path.read_text()) if path.exists() else {"status": "not started"}
        if code is None and result["status"] == "running":
            result["status"] = "timed out"
        elif code not in (0, None) and result["status"] == "running":
            result["status"] = f"crashed (exit {code})"
        result["budget_s"] = budgets[spec["name"]]
        run.note(spec["name"], result)


def cuda_tests(run: Run, budget_s: float) -> dict[str, Any]:
    """The suite's CUDA tests (``cuda_selection.py``), from the test files that mark or skip
    a test for CUDA (collecting only those keeps the step short), with a JUnit report read
    back for the counts."""
    files = sorted(
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if CUDA_TEST.search(p.read_text())
    )
    report = run.out / "cuda-tests.xml"
    outcomes = run.work / "cuda-tests.jsonl"
    env_path = run.env.get("PYTHONPATH", "")
    run.env["PYTHONPATH"] = os.pathsep.join(p for p in (env_path, str(HERE)) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "cuda_selection", "-p"]
    command += ["no:cacheprovider", "-o", "addopts=", f"--junitxml={report}"]
    command += ["--outcomes", str(outcomes), *files]
    report.unlink(missing_ok=True)
    outcomes.unlink(missing_ok=True)
    try:
        code, seconds = run.child(command, budget_s + GRACE_S)
    finally:
        run.env["PYTHONPATH"] = env_path
    if not report.exists():  # killed: the outcomes of the tests that finished
        status = "timed out" if code is None else f"crashed (exit {code})"
        lines = outcomes.read_text().splitlines() if outcomes.exists() else []
        tests = [json.loads(line) for line in lines if line.strip()]
        figures = {"files": files, "finished": len(tests), **_counts(tests), "tests": tests}
        return {"status": status, "elapsed_s": seconds, "budget_s": budget_s, "figures": figures}
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    tests = []
    for case in suite.iter("testcase"):
        outcome = "passed"
        message = ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (
                    (found.get("message") or "").splitlines()[0][:200]
                    if found.get("message")
                    else ""
                )
        tests.append(
            {
                "test": f"{case.get('classname')}::{case.get('name')}",
                "outcome": outcome,
                "seconds": float(case.get("time", 0)),
                "message": message,
            }
        )
    counts = _counts(tests)
    return {
        "status": "ok"
        if code in (0, 5) and not counts["failed"] and not counts["error"]
        else "failed",
        "elapsed_s": seconds,
        "budget_s": budget_s,
        "figures": {"files": files, "selected": len(tests), **counts, "tests": tests},
    }


def _counts(tests: list[dict[str, Any]]) -> dict[str, int]:
    return {
        o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "error", "skipped")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out/gpu-run")))
    parser.add_argument("--device", default="cuda", help="where calibration runs (default cuda)")
    parser.add_argument("--small", action="store_true", help="tiny shapes: proves the steps")
    parser.add_argument("--dry-run", action="store_true", help="the same as --device cpu --small")
    parser.add_argument("--budget-s", type=float, help="the whole run's seconds (480; small: 120)")
    parser.add_argument(
        "--wheels",
        type=Path,
        help="install these wheels first (default: benchmarks/gpu/wheels "
        "when it exists and no --dry-run)",
    )
    parser.add_argument("--target", type=Path, default=Path("/tmp/llmc-gpu-site"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/llmc-gpu-work"))
    parser.add_argument("--steps", nargs="+", help="only these steps (versions always runs)")
    parser.add_argument(
        "--no-propagate",
        action="store_true",
        help="the 8B compress without error propagation only (default: with, then without "
        "when the budget holds it)",
    )
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.small = "cpu", True
    if args.budget_s is None:
        args.budget_s = SMALL_BUDGET_S if args.small else FULL_BUDGET_S
    if args.wheels is None and not args.dry_run and DEFAULT_WHEELS.exists():
        args.wheels = DEFAULT_WHEELS
    wanted = set(args.steps or ("cuda_tests", *MEASURING)) | {"versions"}

    run = Run(args)
    shutil.rmtree(run.work / "llama", ignore_errors=True)
    if args.wheels is not None:
        run.note("install", install(run, args.wheels.resolve(), args.target.resolve()))
    budgets = {name: share * args.budget_s for name, share in SHARES.items()}
    measuring = [name for name in MEASURING if name in wanted]
    if args.small:  # one process for the measuring steps, versions first (see the docstring)
        groups = [["versions", *measuring]]
        if "cuda_tests" in wanted:
            run.note("cuda_tests", cuda_tests(run, budgets["cuda_tests"]))
    else:
        run_steps(run, ["versions"], budgets)
        if "cuda_tests" in wanted:
            run.note("cuda_tests", cuda_tests(run, budgets["cuda_tests"]))
        groups = [[name] for name in measuring]
    for group in groups:
        if "llama" in group:
            spent = sum(budgets[n] for n in group if n != "llama")
            budgets["llama"] = max(run.left_s() - spent, 0.0)
        run_steps(run, group, budgets)
    run.save()
    print((run.out / "summary.txt").read_text())


if __name__ == "__main__":
    main()
