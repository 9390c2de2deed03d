"""Run measuring steps of the GPU run in this process: ``python step.py SPEC.json``.

``run.py`` starts this with a spec naming the steps (``versions``, ``kernels``, ``refmodel``,
``llama``), each with its budget and result file. Each step module has ``run(spec, save)``:
``spec`` is the step's settings, ``save(result)`` records what it has measured so far. Here
each result is written as ``{"status": ..., "elapsed_s": ..., "figures": {...}}``: ``running``
while the step works (what a step killed at its timeout leaves), then ``ok``, or ``failed``
with the error and its place. A failed step does not stop the steps after it.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/: the shared _rss and _worker helpers
from _worker import failure_text  # noqa: E402
from common import write_result  # noqa: E402

#: step name -> the module holding its ``run`` (never a name an installed package has:
#: benchmarks/gpu/ is on sys.path, and transformers probes ``import kernels`` at import time)
MODULES = {
    "versions": "versions",
    "kernels": "kernel_speed",
    "refmodel": "reference_model",
    "llama": "llama",
}


def run_step(step: dict[str, Any]) -> None:
    """One step, its result file kept current (see the module docstring)."""
    path = Path(step["result"])
    start = time.perf_counter()

    def save(figures: dict[str, Any], status: str = "running") -> None:
        elapsed = time.perf_counter() - start
        write_result(path, {"status": status, "elapsed_s": elapsed, "figures": figures})

    save({})
    try:
        module = importlib.import_module(MODULES[step["name"]])
        figures = module.run(step, save)
    except Exception as err:  # a failed step is a result; the next step still runs
        elapsed = time.perf_counter() - start
        previous = json.loads(path.read_text()).get("figures", {})
        write_result(
            path,
            {
                "status": "failed",
                "elapsed_s": elapsed,
                "error": failure_text(err),
                "traceback": traceback.format_exc().splitlines()[-12:],
                "figures": previous,
            },
        )
        print(f"step {step['name']} failed: {failure_text(err)}", file=sys.stderr, flush=True)
        return
    save(figures, "ok")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec["steps"] and spec["steps"][0]["small"] and spec["steps"][0]["device"] == "cpu":
        # the dry run's tiny matrices: with several threads each of the sweep's thousands of
        # small ops waits for the slowest thread, and CI's two cores are shared
        import torch

        torch.set_num_threads(1)
    for step in spec["steps"]:
        run_step(step)


if __name__ == "__main__":
    main()
