"""Keep a device run's whole output in the repository, where the docs read its verdicts.

The device call returns what ``run.py`` wrote to ``$OUT`` (``gpu-benchmark.json``,
``summary.txt``, ``cuda-tests.xml``, ``steps.log``); this copies every one of those files into
``benchmarks/results/gpu/<date>-<commit>/``, the date the run's own and the commit this
checkout's (the device machine gets the working tree without its history), and adds
``provenance.json`` saying both. Commit the folder with the change that ran it; then
``python benchmarks/tables.py`` writes the GPU page's goals from it.

    python benchmarks/gpu/keep.py /path/the/device/tool/returned
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = REPO / "benchmarks" / "results" / "gpu"
FILES = ("gpu-benchmark.json", "summary.txt", "cuda-tests.xml", "steps.log")


def head_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()

    dirty = any(
        not line[3:].startswith("benchmarks/results/")
        for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
    )
    return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the folder the device call's files came back in")
    args = parser.parse_args()
    record_path = args.source / "gpu-benchmark.json"
    if not record_path.is_file():
        print(
            f"error: {record_path} does not exist: name the folder holding the run's output",
            file=sys.stderr,
        )
        return 2
    record = json.loads(record_path.read_text())
    commit = head_commit()
    folder = RESULTS / f"{record.get('date', 'undated')}-{commit[:10]}"
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    kept = [name for name in FILES if (args.source / name).is_file()]
    for name in kept:
        shutil.copy2(args.source / name, staging / name)
    provenance = {
        "commit": commit,
        "date": record.get("date"),
        "command": record.get("command"),
        "files": kept,
    }
    (staging / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    missing = sorted(set(FILES) - set(kept))
    print(
        f"kept {', '.join(kept)} in {folder.relative_to(REPO)}"
        + (f"; missing: {', '.join(missing)}" if missing else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
