"""One measurement per fresh process: how a worker reports, and how its parent reads it.

Standard library only, so the workers under ``_reference/`` (which run in the llm-compressor
venv and import nothing from llmc-trace) report the same way as the scripts that start them: a
worker prints one line ``RESULT {json}``; a failure it catches is a result with ``error``.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from typing import Any


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
