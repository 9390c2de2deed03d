"""A pytest plugin that keeps only the tests a machine without CUDA never runs.

Loaded with ``-p cuda_selection``: a test is kept when it carries the ``cuda`` marker, or a
``skipif`` marker whose reason names CUDA or a GPU (the suite's way to skip cleanly without
one); every other collected test is deselected. On a GPU machine the kept tests are the ones
no CI run has exercised; on a CPU they all skip, which proves the selection without a GPU.

With ``--outcomes PATH`` each test's outcome is appended to PATH as one JSON line the moment
it is known: a run killed at its budget writes no JUnit report, but keeps these.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NEEDS_DEVICE = re.compile(r"\b(cuda|gpu)\b", re.IGNORECASE)


def needs_cuda(item: pytest.Item) -> bool:
    if item.get_closest_marker("cuda") is not None:
        return True
    return any(
        NEEDS_DEVICE.search(str(marker.kwargs.get("reason", "")))
        for marker in item.iter_markers("skipif")
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [item for item in items if needs_cuda(item)]
    dropped = [item for item in items if not needs_cuda(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


_outcomes: list[Path] = []  # where --outcomes writes, once configured


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--outcomes", help="append each test's outcome here as a JSON line")


def pytest_configure(config: pytest.Config) -> None:
    # under xdist the controller reports every test: its workers write nothing
    if config.getoption("outcomes") and not hasattr(config, "workerinput"):
        _outcomes[:] = [Path(config.getoption("outcomes"))]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The test's outcome once known: its call's, or a setup's that skipped or failed, or a
    teardown's that failed (an error, as JUnit counts it)."""
    if not _outcomes:
        return
    if report.when == "call":
        outcome = report.outcome
    elif report.when == "setup" and not report.passed:
        outcome = "skipped" if report.skipped else "error"
    elif report.when == "teardown" and report.failed:
        outcome = "error"
    else:
        return
    message = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:  # the exception's own line, as JUnit's message gives it
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else report.longreprtext
    line = {"test": junit_name(report.nodeid), "outcome": outcome, "seconds": report.duration}
    first_line = (message.strip().splitlines() or [""])[0][:200]
    with _outcomes[0].open("a") as out:
        out.write(json.dumps({**line, "message": first_line}) + "\n")


def junit_name(nodeid: str) -> str:
    """``classname::name`` as the JUnit report gives a test (``tests/a/test_b.py::C::t[x]``
    -> ``tests.a.test_b.C::t[x]``), so a killed step's tests read as a finished step's."""
    path, *inner = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return "::".join([".".join([module, *inner[:-1]]), inner[-1]]) if inner else module
