"""``llmc-trace coverage --all``: every generative model type of transformers, swept and shipped.

The sweep's JSON ships with the package (``src/llmc_trace/models/builtin/coverage-all.json``:
``attempt --fix`` and ``compress`` try the fix it verified for a type first), so it stays there
and is not copied here. This benchmark reruns the sweep (``llmc-trace --quiet coverage --all
--json --workers 2``, about 2 minutes, in a fresh process), rewrites that shipped file with what
it printed, and writes ``benchmarks/results/coverage_all.json`` (``--result`` names another
file): the command, the sweep's own envelope (transformers and torch, its wall and CPU seconds,
workers, the summary counts), the process's wall and CPU seconds (``wait4``) and peak resident
set, the shipped file's path and sha256, and each (type, modality) whose outcome, config, fix,
class, subgraph count or reason changed from the file it replaced (``changes``).

``tables(result)`` renders the README's table from the shipped file, through the package's own
``coverage --table`` code (``sweep_report.sweep_table``), after checking that the file's sha256
is the result's: a shipped file changed without rerunning this benchmark is an error, so the
table and the result cannot disagree.

    python benchmarks/coverage_all.py                     # the whole sweep, rewrites the JSON
    python benchmarks/coverage_all.py --models gpt2 llama --json /tmp/sweep.json \\
        --result /tmp/coverage_all.json                   # a smoke test, shipped file untouched
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import ROOT, Run  # noqa: E402
from _worker import run_measured  # noqa: E402

SHIPPED = ROOT / "src" / "llmc_trace" / "models" / "builtin" / "coverage-all.json"
CLI = Path(sys.executable).with_name("llmc-trace")  # the command a user types, as installed
#: What a row says apart from its seconds: a change in any of these is reported.
ROW_FIELDS = ("outcome", "config", "fix", "model_class", "subgraphs", "problem")


class StaleShippedFile(Exception):
    """The shipped sweep is not the one this result recorded."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_sweep(workers: int, models: list[str]) -> tuple[str, dict[str, Any]]:
    """``coverage --all --json`` in a fresh process: what it printed, and its wall and CPU
    seconds and peak resident set (the largest of the process and its workers)."""
    command = [str(CLI), "--quiet", "coverage", "--all", "--json", "--workers", str(workers)]
    for model in models:
        command += ["--model", model]
    stdout, measured = run_measured(command, "coverage --all")
    rounding = {"wall_s": 1, "cpu_s": 1, "peak_rss_gib": 3}
    process = {k: round(v, rounding[k]) if k in rounding else v for k, v in measured.items()}
    return stdout, process


def changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Each (type, modality) added, gone, or whose row changed in any of ``ROW_FIELDS``."""
    if old is None:
        return []

    def by_pair(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(row["model_type"], row["modality"]): row for row in document["rows"]}

    before, after = by_pair(old), by_pair(new)
    found = []
    for pair in sorted(before.keys() | after.keys()):
        label = f"{pair[0]} · {pair[1]}"
        if pair not in after:
            found.append(f"{label}: gone (was {before[pair]['outcome']})")
        elif pair not in before:
            found.append(f"{label}: new ({after[pair]['outcome']})")
        else:
            moved = [
                f"{field} {before[pair][field]!r} -> {after[pair][field]!r}"
                for field in ROW_FIELDS
                if before[pair][field] != after[pair][field]
            ]
            if moved:
                found.append(f"{label}: " + "; ".join(moved))
    return found


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``table``: the README's table, rendered by ``coverage --table``'s code from the shipped
    file, once its sha256 is checked against the result's."""
    from llmc_trace.attempt.sweep_report import sweep_table

    shipped = result["figures"]["shipped"]
    path = ROOT / shipped["path"]
    if not path.is_file():
        raise StaleShippedFile(f"{shipped['path']} is missing: rerun benchmarks/coverage_all.py")
    if sha256(path) != shipped["sha256"]:
        raise StaleShippedFile(
            f"{shipped['path']} changed since the run recorded in coverage_all.json (its sha256 "
            "differs): rerun python benchmarks/coverage_all.py, which rewrites both"
        )
    return {"table": sweep_table(json.loads(path.read_text()))}


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: the sweep's verified share, from the shipped file's summary."""
    summary = json.loads((ROOT / result["figures"]["shipped"]["path"]).read_text())["summary"]
    return [
        (
            "Every generative model type of transformers, traced and replayed on a twin",
            f"{summary['verified']} of {summary['counted']} types verified "
            f"({summary['verified_share']:.1%})",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="processes the sweep runs in")
    parser.add_argument("--models", nargs="+", default=[], help="model types (default: all)")
    parser.add_argument(
        "--json", type=Path, default=SHIPPED, help="where the sweep's JSON goes (default: shipped)"
    )
    parser.add_argument(
        "--result", type=Path, help="where to write the result (default: benchmarks/results/)"
    )
    args = parser.parse_args()
    target = args.json.resolve()
    if args.models and target == SHIPPED:
        parser.error("a partial sweep (--models) must not replace the shipped file: pass --json")
    run = Run("coverage_all")
    old = json.loads(target.read_text()) if target.is_file() else None
    printed, process = run_sweep(args.workers, args.models)
    document = json.loads(printed)
    target.write_text(printed)
    changed = changes(old, document)
    shown = target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target)
    figures = {
        "sweep_command": f"llmc-trace --quiet coverage --all --json --workers {args.workers}"
        + "".join(f" --model {m}" for m in args.models),
        "models": args.models,  # none named: every generative model type
        "sweep": {key: value for key, value in document.items() if key != "rows"},
        "rows": len(document["rows"]),
        "process": process,
        "shipped": {"path": shown, "sha256": sha256(target)},
        "changes": changed,
    }
    summary = document["summary"]
    print(
        f"coverage --all: {summary['verified']} of {summary['counted']} types verified, "
        f"{len(summary['transformers_cannot_run'])} transformers cannot run and "
        f"{len(summary['not_standalone'])} with no forward of their own apart; "
        f"{document['elapsed_s']:.0f} s, "
        f"{document['cpu_s']:.0f} CPU s (sweep); process peak {process['peak_rss_gib']:.2f} GiB"
    )
    print(f"{len(changed)} rows changed from the file replaced" + (":" if changed else ""))
    for line in changed:
        print(f"  {line}")
    result_path = run.write(figures, path=args.result)
    print(tables(json.loads(result_path.read_text()))["table"])


if __name__ == "__main__":
    main()
