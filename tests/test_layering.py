"""The package layout: top-level modules are the public API and the errors; imports go down.

Each package may import from packages of an earlier layer (and from itself), never from a
later one: so a package can be read, tested and replaced knowing only what lies below it. The
README's "How it works" draws the same layers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "llmc_trace"

#: Lowest first; packages in one layer do not import each other.
LAYERS: list[set[str]] = [
    {"errors"},
    {"core"},
    {"models", "tracing", "data", "algorithms"},
    {"graph"},
    {"diagnose"},
    {"traced"},
    {"pipelines", "checkpoint", "render"},
    {"attempt", "plan"},
    {"report"},
    {"oneshot", "evaluate", "compat"},
    {"cli"},
]


def layer_of(package: str) -> int:
    return next(i for i, members in enumerate(LAYERS) if package in members)


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "llmc_trace":
                found.add(parts[1] if len(parts) > 1 else "llmc_trace")
    return found


def test_the_top_level_holds_only_the_api_the_errors_and_packages() -> None:
    modules = sorted(p.name for p in SOURCE.glob("*.py"))
    assert modules == ["__init__.py", "errors.py"]
    packages = {p.name for p in SOURCE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set().union(*LAYERS) - {"errors"}


def test_no_import_runs_upwards() -> None:
    upward = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE)
        if relative.parts == ("__init__.py",):
            continue  # the public API may name anything
        own = relative.parts[0].removesuffix(".py")
        for package in imported_packages(path):
            if package == "llmc_trace" or (package != own and layer_of(package) >= layer_of(own)):
                upward.append(f"{relative} imports llmc_trace.{package}")
    assert upward == []


@pytest.mark.parametrize(
    ("arguments", "exit_code"),
    [
        (["--help"], 0),
        (["attempt", "--help"], 0),
        (["compress", "--help"], 0),
        (["attempt", "--no-such-flag"], 2),
        (["attempt", "--modality", "smell", "--model", "x"], 2),
    ],
)
def test_the_command_line_answers_without_torch(arguments: list[str], exit_code: int) -> None:
    """Help and bad flags must not wait for torch and transformers to import (seconds)."""
    code = (
        "import sys\n"
        "from llmc_trace.cli.main import cli\n"
        f"try:\n    cli.main({arguments!r}, prog_name='llmc-trace')\n"
        "except SystemExit as done:\n"
        "    print('exit', done.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.splitlines()[-1] == f"exit {exit_code} False False", result.stderr
