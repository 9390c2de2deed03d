"""Write every results table in the docs from the result files under ``benchmarks/results/``.

A page asks for a table with a pair of markers; what lies between them is generated::

    <!-- table: compress_scale:speed -->
    ...
    <!-- /table -->

``compress_scale`` names ``benchmarks/results/compress_scale.json``; ``speed`` one of the tables
that the benchmark which wrote it renders (its module's ``tables(result)``, the same function
that prints the table when the benchmark runs, so the docs show what the run printed). Under
each table comes the line that says where it is from: the result file, the command that reruns
it, the date and the machine (the file holds the commit, versions and load; the pages name no
commit). ``:goals`` renders any result's judged goals (goal,
target, figure, met/missed), and ``gpu:goals`` those of the newest device run committed under
``benchmarks/results/gpu/<date>-<commit>/`` (or says that none is).

    python benchmarks/tables.py            # rewrite the tables in README.md and guides/
    python benchmarks/tables.py --check    # exit 1, naming each table that differs

A marker naming a result file or a table that does not exist is an error: a page never keeps a
table nobody can regenerate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
GPU_RESULTS = RESULTS / "gpu"
PAGES = [ROOT / "README.md", *sorted((ROOT / "guides").rglob("*.md"))]
MARKER = re.compile(
    r"(?P<open><!-- table: (?P<key>[\w.-]+(?::[\w.-]+)?) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)",
    re.DOTALL,
)


class TableError(Exception):
    """A marker that cannot be rendered: the page, the key and why."""


@cache
def result(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise TableError(f"no result file benchmarks/results/{name}.json")
    return json.loads(path.read_text())


@cache
def module_of(document_command: str) -> ModuleType:
    """The benchmark script the result's command ran, imported (its ``main`` is not run)."""
    words = shlex.split(document_command)
    script = ROOT / next(word for word in words if word.endswith(".py"))
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def goals_table(goals: list[dict[str, Any]]) -> str:
    lines = ["| goal | target | figure | verdict |", "|---|---|---|---|"]
    for g in goals:
        lines.append(f"| {g['goal']} | {g['target']} | {g['figure']} | **{g['verdict']}** |")
    return "\n".join(lines)


def source_line(document: dict[str, Any], name: str) -> str:
    """Where a table is from: the file (which holds the commit, versions and load too), the
    command that reruns it, the date and the machine."""
    m = document["machine"]
    where = m.get("gpu") or m["cpu"]
    return (
        f"<small>From `benchmarks/results/{name}.json`: `{document['command']}`, "
        f"{document['date']}, {where} ({m['cores']} cores).</small>"
    )


def gpu_block() -> str:
    """The GPU goals as the newest kept device run judges them (``summary.goals``); without
    one, every goal's target with the verdict that it awaits a device."""
    runs = sorted(p for p in GPU_RESULTS.glob("*/gpu-benchmark.json")) if GPU_RESULTS.is_dir() else []
    sys.path.insert(0, str(HERE / "gpu"))
    from summary import goals  # noqa: PLC0415 (the GPU package's own judge)

    if not runs:
        awaiting = goals({"mode": "full", "steps": {}})
        rows = [
            {"goal": name, "target": g["target"], "figure": "-", "verdict": "awaits a device run"}
            for name, g in awaiting.items()
        ]
        return (
            "No device run has been committed yet: no folder under `benchmarks/results/gpu/` "
            f"holds a `gpu-benchmark.json`, so each of the {len(rows)} goals awaits one.\n\n"
            + goals_table(rows)
        )
    path = runs[-1]
    record = json.loads(path.read_text())
    rows = []
    for name, g in goals(record).items():
        verdict = {True: "met", False: "missed", None: "not judged"}[g["met"]]
        value = "-" if g["value"] is None else f"{g['value']:,.3g}"
        rows.append({"goal": name, "target": g["target"], "figure": value, "verdict": verdict})
    date = record.get("date") or path.parent.name[:10]
    return goals_table(rows) + (
        f"\n\n<small>From the device run of {date} kept under `benchmarks/results/gpu/` "
        "(`gpu-benchmark.json`, `summary.txt`, `cuda-tests.xml`, `steps.log`).</small>"
    )


#: The README's summary, a row per claim: each result's script says its headline figures
#: (``headline(result) -> [(what, figure), ...]``), and the row links the page that explains it.
HEADLINES = (
    ("coverage_all", "guides/architectures.md#every-generative-model-type-of-transformers"),
    ("instance_tracing", "guides/llm-compressor.md"),
    ("trace_speed", "guides/benchmarks.md#tracing"),
    ("gptq_agreement", "guides/benchmarks.md#quality-on-the-reference-model"),
    ("compress_scale", "guides/benchmarks.md#at-scale"),
    ("vlm_quality", "guides/benchmarks.md#vision-language-models"),
    ("vlm_calibration", "guides/benchmarks.md#image-calibration-side-by-side"),
    ("moe_quality", "guides/benchmarks.md#mixture-of-experts-models"),
    ("vllm_serving", "guides/serving.md"),
)


def headlines() -> str:
    lines = ["| result | figure | from |", "|---|---|---|"]
    for name, page in HEADLINES:
        document = result(name)
        headline = getattr(module_of(document["command"]), "headline", None)
        if headline is None:
            raise TableError(f"the script of {name}.json says no headline")
        file = f"benchmarks/results/{name}.json"
        for what, figure in headline(document):
            lines.append(f"| [{what}]({page}) | {figure} | [{name}.json]({file}) |")
    return "\n".join(lines)


def render(key: str) -> str:
    name, _, table = key.partition(":")
    if name == "headlines":
        return headlines()
    if name == "gpu":
        if table != "goals":
            raise TableError(f"gpu has only the table 'goals', not {table!r}")
        return gpu_block()
    document = result(name)
    if table == "goals":
        if not document.get("goals"):
            raise TableError(f"{name}.json judges no goals")
        body = goals_table(document["goals"])
    else:
        tables: Callable[[dict[str, Any]], dict[str, str]] = getattr(
            module_of(document["command"]), "tables", None
        )
        if tables is None:
            raise TableError(f"the script of {name}.json renders no tables")
        rendered = tables(document)
        if table not in rendered:
            raise TableError(f"{name}.json has no table {table!r} (it has: {', '.join(rendered)})")
        body = rendered[table]
    return body.rstrip() + "\n\n" + source_line(document, name)


def shown(page: Path) -> str:
    """A page as the messages name it: from the repository's root where it lies inside."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)


def regenerate(text: str, page: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        try:
            body = render(match["key"])
        except TableError as err:
            raise TableError(f"{shown(page)}: table {match['key']}: {err}") from err
        return f"{match['open']}{body}\n{match['close']}"

    return MARKER.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a page's table is stale")
    parser.add_argument("pages", nargs="*", type=Path, help="pages to process (default: all)")
    args = parser.parse_args(argv)
    pages = [p.resolve() for p in args.pages] or PAGES
    stale, count = [], 0
    try:
        for page in pages:
            text = page.read_text()
            count += len(MARKER.findall(text))
            new = regenerate(text, page)
            if new != text:
                stale.append(shown(page))
                if not args.check:
                    page.write_text(new)
    except TableError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(
            "stale tables (the result files say otherwise) in: " + ", ".join(stale)
            + "\nrun: python benchmarks/tables.py",
            file=sys.stderr,
        )
        return 1
    verb = "checked" if args.check else "wrote"
    print(f"{verb} {count} tables in {len(pages)} pages" + (f"; rewrote {', '.join(stale)}" if stale and not args.check else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
