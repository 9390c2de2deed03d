"""The package layout: top-level modules are the public API and the errors; imports go down.

Each package may import from packages of an earlier layer (and from itself), never from a
later one: so a package can be read, tested and replaced knowing only what lies below it. The
docs' "How it works" page (guides/architecture.md) draws the same layers.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "llmc_trace"

#: Lowest first; packages in one layer do not import each other.
LAYERS: list[set[str]] = [
    {"errors"},
    {"core"},
    {"layers"},
    {"moe"},
    {"models", "tracing", "data", "algorithms"},
    {"graph", "twins", "spec"},
    {"diagnose"},
    {"traced"},
    {"pipelines", "checkpoint", "render"},
    {"attempt", "plan", "calibrate"},
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


def module_name(path: Path) -> str:
    """``llmc_trace.moe.observe`` for ``moe/observe.py``, ``llmc_trace.moe`` for its
    ``__init__.py``."""
    parts = ("llmc_trace", *path.relative_to(SOURCE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The llmc_trace modules that ``path`` imports, at module level, inside a function or
    under ``if TYPE_CHECKING:`` (a cycle through a deferred or a type-only import is one all the
    same: each module still needs the other to be read or checked). ``from package import
    name`` counts as importing the submodule ``name`` when there is one."""
    found = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        pending.extend(ast.iter_child_nodes(node))
    return found


def test_no_import_cycle_between_modules() -> None:
    """No module imports itself through others (an AST walk, so nothing is imported): each can
    be read, tested and replaced after the ones it imports, and none works only by the order
    in which its imports happen to run."""
    paths = {module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}
    graph = nx.DiGraph()
    for name, path in paths.items():
        graph.add_node(name)
        graph.add_edges_from((name, imported) for imported in imported_modules(path, set(paths)))
    assert sorted(sorted(cycle) for cycle in nx.simple_cycles(graph)) == []


def test_the_import_walk_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    """The cycle core/experts.py and core/linear.py had (one import inside a function), and
    the one tracing/proxy.py and tracing/tracer.py had (one under ``TYPE_CHECKING``)."""
    linear = tmp_path / "linear.py"
    linear.write_text("from llmc_trace.core.experts import ExpertProjection\n")
    experts = tmp_path / "experts.py"
    experts.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llmc_trace.core import names\n"
        "def router_layers():\n    from llmc_trace.core.linear import as_linear\n"
    )
    modules = {f"llmc_trace.core{name}" for name in ("", ".experts", ".linear", ".names")}
    assert imported_modules(linear, modules) == {"llmc_trace.core.experts"}
    assert imported_modules(experts, modules) == {"llmc_trace.core.linear", "llmc_trace.core.names"}


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


#: What compress does without: Graphviz and the render package draw for ``attempt``,
#: ``render`` and a checkpoint's report.html; networkx no module of the package imports (only
#: the cycle check above).
DRAWING_MODULES = ("graphviz", "networkx", "llmc_trace.render")


def imported_of(modules: tuple[str, ...]) -> str:
    """Code that prints which of ``modules`` the child process imported, as its last line."""
    return f"print('imported', sorted(set({modules!r}) & set(sys.modules)))\n"


def test_compress_help_imports_nothing_that_draws() -> None:
    """``compress --help`` builds the whole command group: no other command's work (attempt,
    its views, the drawings) comes along."""
    code = (
        "import sys\n"
        "from llmc_trace.cli.main import cli\n"
        "try:\n    cli.main(['compress', '--help'], prog_name='llmc-trace')\n"
        "except SystemExit:\n    pass\n"
        + imported_of((*DRAWING_MODULES, "llmc_trace.attempt", "llmc_trace.cli.display"))
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.splitlines()[-1:] == ["imported []"], result.stderr


def test_the_public_compress_in_a_fresh_interpreter_imports_nothing_that_draws(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """``from llmc_trace import compress`` in a fresh interpreter is the driver's function
    (not the subpackage of the same name), and a whole run through it (trace, fix search,
    calibration, checkpoint, report.json and report.html) imports no drawing: Graphviz and the
    trace viewer would be start-up time spent on pictures the run never makes (the report
    page lays its overview out itself). Before it, the solvers and the Hessian import neither
    compressed-tensors nor transformers (seconds a rank or a kernel's process would spend on
    presets it never reads). One interpreter proves all three: each costs seconds of imports
    before any work."""
    folder, data = saved_llama
    out = tmp_path / "out"
    code = (
        "import sys\n"
        "import llmc_trace.algorithms.gptq, llmc_trace.algorithms.hessian\n"
        "import llmc_trace.algorithms.sparsegpt\n"
        "print('solvers import', sorted({'compressed_tensors', 'transformers'} & set(sys.modules)))\n"
        "from llmc_trace import CompressRequest, compress\n"
        "import llmc_trace.algorithms, llmc_trace\n"
        "print('public', callable(compress), compress.__module__, llmc_trace.compress is compress,"
        " CompressRequest.__module__)\n"
        f"request = CompressRequest({str(folder)!r}, {str(data)!r}, {str(out)!r}, samples=4,"
        " seq_len=32)\n"
        "result = compress(request)\n"
        "assert result.report.layers\n" + imported_of(DRAWING_MODULES)
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # tiny ops on a busy machine
    )
    lines = result.stdout.splitlines()
    assert lines[-1:] == ["imported []"], result.stderr[-3000:]
    public = "public True llmc_trace.oneshot.driver True llmc_trace.oneshot.request"
    assert public in lines, result.stdout[-3000:]
    assert "solvers import []" in lines, result.stdout[-3000:]
    assert '<g class="node" id="sg-' in (out / "report.html").read_text()
