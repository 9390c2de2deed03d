"""Run llm-compressor's own pipeline tests against ``llmc_trace.compat``, imports changed.

Each test file under ``tests/llmcompressor/pipelines`` of an llm-compressor source tree is
rewritten into a scratch folder with one change: every import from
``llmcompressor.pipelines...`` imports the names ``llmc_trace.compat`` offers from there instead
(a name it does not offer is left undefined, so the tests that use it fail naming it). Other
imports (modifiers, ``DatasetArguments``, test utilities) still come from llm-compressor: they
are what the tests feed the pipeline API, not what they test. The tests then run in the
reference environment, which has llm-compressor 0.14.0.1 (``bash benchmarks/reference_env.sh``).
The tests are those of the installed release: its source distribution ships them (a git
checkout works too, but its tests must be the installed release's, or they import what the
release does not have)::

    pip download llmcompressor==0.14.0.1 --no-binary :all: --no-deps -d /tmp
    tar -xzf /tmp/llmcompressor-0.14.0.1.tar.gz -C /tmp
    benchmarks/.venv-llmc/bin/python benchmarks/llmc_pipeline_tests.py /tmp/llmcompressor-0.14.0.1

It prints a table of the tests that did not pass and why, the counts, and pytest's summary
line, and writes ``benchmarks/results/llmc_pipeline_tests.json`` (``--result`` names another
file): which tree's tests ran (its version, or its commit for a git checkout), every test's
outcome (from pytest's JUnit XML) and the counts; ``tables(result)`` renders the tables printed
here and in the docs from it. Exit status 0. The tests that need the Hub (they download
``Qwen/Qwen3-0.6B``) or a GPU fail or skip where neither is at hand, and the counts say so as
they are: nothing is excluded.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# the reference venv sees the project's venv through a .pth file, which does not run the
# editable install's finder: the package is imported from its source folder
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))

import llmc_trace.compat  # noqa: E402
from _results import Run  # noqa: E402

PIPELINE_TESTS = Path("tests/llmcompressor/pipelines")
OUTCOMES = ("passed", "failed", "error", "skipped")
MESSAGE_CHARS = 200


def rewrite_imports(source: str) -> str:
    """``source`` with each ``from llmcompressor.pipelines... import a, b`` replaced by an
    import of the names ``llmc_trace.compat`` offers, on the same lines."""
    lines = source.splitlines()
    tree = ast.parse(source)
    imports = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("llmcompressor.pipelines")
    ]
    for node in sorted(imports, key=lambda n: n.lineno, reverse=True):
        offered = [a for a in node.names if a.name in llmc_trace.compat.__all__]
        missing = [a.name for a in node.names if a.name not in llmc_trace.compat.__all__]
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in offered)
        indent = " " * node.col_offset
        replacement = [f"{indent}from llmc_trace.compat import {names}"] if offered else []
        if missing:
            replacement.append(f"{indent}# not offered by llmc_trace.compat: {', '.join(missing)}")
        end = node.end_lineno or node.lineno
        lines[node.lineno - 1 : end] = replacement or [f"{indent}pass"]
    return "\n".join(lines) + "\n"


def source_tree(source: Path) -> dict[str, str | None]:
    """Which llm-compressor tests ran: the source distribution's version (``PKG-INFO``), or
    the commit of a git checkout."""
    version = None
    info = source / "PKG-INFO"
    if info.is_file():
        version = next(
            (line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("Version:")),
            None,
        )  # fmt: skip
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    commit = (done.stdout.strip() or None) if done.returncode == 0 and not info.is_file() else None
    return {"version": version, "commit": commit}


def test_outcomes(junit: Path) -> list[dict[str, Any]]:
    """Every test case of pytest's JUnit XML: its name, outcome and the first line of why.

    A file that fails to import is one ``error`` case named after the file, as pytest reports it.
    """
    cases = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "failed" if tag == "failure" else tag
                text = found.get("message") or found.text or ""
                message = " ".join(text.split())[:MESSAGE_CHARS]
                break
        name = case.get("name", "")
        test = f"{case.get('classname', '')}::{name}"
        cases.append({"test": test, "outcome": outcome, "message": message})
    return cases


def run_tests(tests: Path) -> tuple[list[dict[str, Any]], str]:
    """The rewritten tests run by pytest in this interpreter: each case's outcome, and pytest's
    summary line."""
    with tempfile.TemporaryDirectory(prefix="llmc-pipeline-tests-") as scratch:
        for path in sorted(p for p in tests.rglob("*.py") if p.is_file()):
            target = Path(scratch) / path.relative_to(tests)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rewrite_imports(path.read_text()))
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
        junit = Path(scratch) / "junit.xml"
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
            + ["--continue-on-collection-errors", f"--junitxml={junit}", scratch],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
        )
        cases = test_outcomes(junit) if junit.is_file() else []
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr
    return cases, summary


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``summary``: the counts of each outcome; ``not_passed``: each test that did not pass, why."""
    figures = result["figures"]
    counts = figures["counts"]
    tree = figures["source"]
    tests = f"llm-compressor {tree['version']}" if tree["version"] else f"commit {tree['commit']}"
    summary = [
        "| tests of | tests | passed | failed | errors | skipped |",
        "|---|---|---|---|---|---|",
        f"| {tests} | {figures['total']} | {counts['passed']} | {counts['failed']} "
        f"| {counts['error']} | {counts['skipped']} |",
    ]
    not_passed = ["| test | outcome | why |", "|---|---|---|"]
    for case in figures["tests"]:
        if case["outcome"] != "passed":
            why = case["message"].replace("|", "\\|")
            not_passed.append(f"| `{case['test']}` | {case['outcome']} | {why} |")
    return {"summary": "\n".join(summary), "not_passed": "\n".join(not_passed)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an llm-compressor source tree")
    parser.add_argument(
        "--result", type=Path, help="where to write the result (default: benchmarks/results/)"
    )
    args = parser.parse_args()
    tests = args.source / PIPELINE_TESTS
    if not tests.is_dir():
        parser.error(f"{tests} does not exist: pass the root of an llm-compressor checkout")
    run = Run("llmc_pipeline_tests")
    cases, pytest_summary = run_tests(tests)
    counts = {outcome: sum(c["outcome"] == outcome for c in cases) for outcome in OUTCOMES}
    figures = {
        "source": source_tree(args.source),
        "total": len(cases),
        "counts": counts,
        "pytest_summary": pytest_summary,
        "tests": cases,
    }
    document = {"figures": figures}
    rendered = tables(document)
    print(rendered["not_passed"])
    print()
    print(rendered["summary"])
    print(pytest_summary)
    run.write(
        figures,
        path=args.result,
        packages=["llmcompressor"],
        notes=[f"{counts['passed']} of {len(cases)} tests pass with only their imports changed."],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
