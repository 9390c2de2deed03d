"""Run llm-compressor's own pipeline tests against ``llmc_trace.compat``, imports changed.

Each test file under ``tests/llmcompressor/pipelines`` of an llm-compressor source tree is
rewritten into a scratch folder with one change: every import from
``llmcompressor.pipelines...`` imports the names ``llmc_trace.compat`` offers from there instead
(a name it does not offer is left undefined, so the tests that use it fail naming it). Other
imports (modifiers, ``DatasetArguments``, test utilities) still come from llm-compressor: they
are what the tests feed the pipeline API, not what they test. The tests then run in the
reference environment, which has llm-compressor 0.14 (``bash benchmarks/reference_env.sh``)::

    git clone https://github.com/vllm-project/llm-compressor /tmp/llmc-src
    git -C /tmp/llmc-src checkout 871643836  # the tests as of 0.14.0.1's pipelines
    benchmarks/.venv-llmc/bin/python benchmarks/llmc_pipeline_tests.py /tmp/llmc-src

It prints one line per test that did not pass, then pytest's summary line; exit status 0.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llmc_trace.compat

REPO = Path(__file__).resolve().parents[1]
PIPELINE_TESTS = Path("tests/llmcompressor/pipelines")


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an llm-compressor source tree")
    args = parser.parse_args()
    tests = args.source / PIPELINE_TESTS
    if not tests.is_dir():
        parser.error(f"{tests} does not exist: pass the root of an llm-compressor checkout")
    with tempfile.TemporaryDirectory(prefix="llmc-pipeline-tests-") as scratch:
        for path in sorted(p for p in tests.rglob("*.py") if p.is_file()):
            target = Path(scratch) / path.relative_to(tests)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rewrite_imports(path.read_text()))
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider"]
            + ["--continue-on-collection-errors", scratch],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
        )
    outcomes = ("FAILED", "ERROR", "SKIPPED")
    report = [line for line in result.stdout.splitlines() if line.startswith(outcomes)]
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr
    print("\n".join([*report, summary]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
