"""The docs' results tables are written from the result files, and a stale one is caught."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """``benchmarks/tables.py`` reading a copy of the result files, with fresh caches."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("tables_under_test", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    monkeypatch.setattr(module, "RESULTS", results)
    monkeypatch.setattr(module, "GPU_RESULTS", results / "gpu")
    yield module
    sys.modules.pop("tables_under_test", None)


def test_every_page_agrees_with_its_result_files(tables) -> None:
    assert tables.main(["--check"]) == 0


def test_an_edited_result_file_makes_the_check_fail(tables, capsys) -> None:
    path = tables.RESULTS / "gptq_chaos.json"
    document = json.loads(path.read_text())
    document["figures"]["rows"][1]["flipped_percent"]["median"] += 1.0
    path.write_text(json.dumps(document))
    assert tables.main(["--check", str(ROOT / "guides" / "gpu.md")]) == 1
    assert "guides/gpu.md" in capsys.readouterr().err


def test_a_marker_without_its_result_file_is_an_error(tables, tmp_path: Path, capsys) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- table: no_such_benchmark:rows -->\n<!-- /table -->\n")
    assert tables.main(["--check", str(page)]) == 2
    assert "no result file benchmarks/results/no_such_benchmark.json" in capsys.readouterr().err


def test_the_gpu_goals_say_plainly_when_no_device_run_is_kept(tables) -> None:
    shutil.rmtree(tables.GPU_RESULTS, ignore_errors=True)
    assert tables.render("gpu:goals").startswith("No device run has been committed yet")


def test_the_gpu_goals_are_judged_by_the_run_s_own_summary(tables) -> None:
    """A kept run's verdicts are ``benchmarks/gpu/summary.goals``' on its record."""
    folder = tables.GPU_RESULTS / "2026-01-01-0123456789"
    folder.mkdir(parents=True)
    record = {
        "mode": "full",
        "date": "2026-01-01",
        "steps": {
            "kernels": {"figures": {"shapes": [{"gptq_over_floor": 1.4}, {"gptq_over_floor": 2.6}]}},
            "llama": {"figures": {"compress_s": 150.0, "samples": 512, "device_peak_over_plan": 0.95}},
        },
    }
    (folder / "gpu-benchmark.json").write_text(json.dumps(record))
    rendered = tables.render("gpu:goals")
    rows = {line.split("|")[1].strip(): line for line in rendered.splitlines() if line.count("|") > 3}
    assert "**met**" in rows["compress_8b_s"]
    assert "**missed**" in rows["gptq_over_floor"] and "2.6" in rows["gptq_over_floor"]
    assert "**met**" in rows["device_peak_over_plan"]
    assert "device run of 2026-01-01" in rendered
