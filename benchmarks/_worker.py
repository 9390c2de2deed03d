"""One measurement per fresh process: how a worker reports, and how its parent reads it.

Standard library only, so the workers under ``_reference/`` (which run in the llm-compressor
venv and import nothing from llmc-trace) report the same way as the scripts that start them: a
worker prints one line ``RESULT {json}``; a failure it catches is a result with ``error``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import traceback
from typing import Any

GiB = 2**30


def failure_text(err: BaseException) -> str:
    """``Type: last line of the message at file:line`` of the innermost frame."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = str(err).strip().splitlines()
    return f"{type(err).__name__}: {message[-1] if message else ''}{where}"


def run_child(command: list[str], what: str, env: dict[str, str]) -> dict[str, Any]:
    """Run one measurement process and return its ``RESULT`` line, or ``{"error": ...}``
    (printed, with ``what``, when the run failed)."""
    child = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    if child.returncode != 0 or not lines:
        tail = (child.stderr or child.stdout).strip().splitlines()[-3:]
        print(f"  {what}: failed (exit {child.returncode}): {' | '.join(tail)}", flush=True)
        return {"error": tail[-1] if tail else f"exit {child.returncode}"}
    result = json.loads(lines[-1].removeprefix("RESULT "))
    if "error" in result:
        print(f"  {what}: failed: {result['error']}", flush=True)
    return result


def run_measured(command: list[str], what: str) -> tuple[str, dict[str, Any]]:
    """Run ``command`` in a fresh process whose stdout is a JSON document: that text, and the
    process's wall and CPU seconds, peak resident set (the largest of it and its children,
    from ``wait4``) and exit code. No output at all is a crash, raised with ``what`` and the
    last line of stderr (a non-zero exit with output is the command's own verdict)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        exit_code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if not stdout.strip():
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} exited {exit_code} without a document: {tail}")
    return stdout, {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gib": usage.ru_maxrss * 1024 / GiB,
        "exit_code": exit_code,
    }
