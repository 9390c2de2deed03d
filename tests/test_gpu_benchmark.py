"""The prepared GPU run (``benchmarks/gpu/``) proved on the CPU: its dry run writes every
figure, and its wheels install with no registry and run from the target folder."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))
import kernel_speed  # noqa: E402
import llama  # noqa: E402
import phases  # noqa: E402
import run as gpu_run  # noqa: E402
import summary  # noqa: E402
import wheels  # noqa: E402
from wheels import record_hash  # noqa: E402

import torch  # noqa: E402

from llmc_trace.algorithms.sweep_kernel import interpreter_problem  # noqa: E402
from llmc_trace.core.device_peak import DevicePeaks  # noqa: E402

SHAPE_FIGURES = (
    "hessian_tokens_per_s",
    "hessian_over_matmul_peak",
    "floor_s",
    "gptq_s",
    "gptq_floor_ratio",
    "sparsegpt_s",
    "sparsegpt_2of4_s",
    "sparsegpt_floor_ratio",
)
TIMED = ("hessian_add", "factor", "block_products", "gptq", "sparsegpt", "sparsegpt_2of4")


def run_gpu_script(*args: str, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, str(GPU / "run.py"), *args]
    child = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]


def cuda_tests_in_suite() -> int:
    """The suite's tests that skip without CUDA, counted from their decorators' source (the
    selection plugin finds them from their markers instead)."""
    decorator = re.compile(r"^@pytest\.mark\.skipif\(.*CUDA", re.MULTILINE)
    return sum(
        len(decorator.findall(path.read_text())) for path in (REPO / "tests").rglob("test_*.py")
    )


def test_the_kernel_figures_quantize_with_the_w4a16_preset() -> None:
    from llmc_trace.algorithms import W4A16

    assert kernel_speed.W4A16_WEIGHTS == W4A16.weights


@pytest.mark.slow
def test_the_dry_run_writes_every_figure(tmp_path: Path) -> None:
    """Every step runs on the CPU with tiny shapes and the JSON holds each figure the GPU run
    reports; the reference model compressed twice on the same device gives one checkpoint."""
    out = tmp_path / "out"
    work = tmp_path / "work"
    # a budget no step nears: on a loaded CI machine a tight one would skip shapes or kill
    # a step, and this test is about the figures, not the seconds
    run_gpu_script("--dry-run", "--budget-s", "900", "--out", str(out), "--work", str(work))
    record = json.loads((out / "gpu-benchmark.json").read_text())
    assert record["mode"] == "small" and record["device"] == "cpu"
    steps = record["steps"]
    assert {name: steps[name]["status"] for name in steps} == dict.fromkeys(
        ("cuda_tests", "versions", "kernels", "refmodel", "llama"), "ok"
    )
    versions = steps["versions"]["figures"]
    assert versions["packages"]["llmc-trace"]["location"].startswith(str(REPO))
    assert all(p["version"] for p in versions["packages"].values())

    tests = steps["cuda_tests"]["figures"]
    assert tests["selected"] == tests["skipped"] == cuda_tests_in_suite() > 0

    kernels = steps["kernels"]["figures"]
    assert sorted(row["name"] for row in kernels["shapes"]) == sorted(summary.GOAL_SHAPES)
    for row in kernels["shapes"]:
        assert all(row[key] > 0 for key in SHAPE_FIGURES), row
        for key in TIMED:  # the median of 5 after a warm-up, with its spread
            timed = row[key]
            assert len(timed["runs_s"]) == kernels["repeats"] == 5, key
            assert timed["min_s"] <= timed["median_s"] <= timed["max_s"], key
            assert timed["spread"] == pytest.approx(timed["max_s"] / timed["min_s"] - 1)
        assert row["gptq_floor_ratio"] == pytest.approx(row["gptq"]["median_s"] / row["floor_s"])
        assert row["sparsegpt_floor_ratio"] == pytest.approx(
            max(row["sparsegpt_s"], row["sparsegpt_2of4_s"]) / row["floor_s"]
        )
    assert kernels["bf16_matmul_tflops"] > 0 and kernels["fp32_matmul_tflops"] > 0
    # the interpreted kernels ran and agreed with the torch loops bit for bit, or, where this
    # Triton's interpreter cannot run with this numpy, the run says so
    agreement = kernels["kernel_agreement"]
    problem = interpreter_problem()
    assert agreement["kernel_ran"] is (problem is None), agreement
    assert agreement["fallback"] == problem
    assert all(v == 0.0 for k, v in agreement.items() if k.endswith("differing")), agreement

    compressed = steps["llama"]["figures"]
    assert set(compressed["runs"]) == {"propagate", "no_propagate"}
    assert set(compressed["runs"]["propagate"]["phases_s"]) == set(phases.PHASES)
    assert set(compressed["runs"]["no_propagate"]["phases_s"]) == set(phases.PHASES) - {
        "propagate_compute",
        "propagate_copy",
    }
    assert compressed["pipeline"] == "sequential" and compressed["propagate"] is True
    assert compressed["layers"] == 7 * compressed["shape"]["layers"]
    assert 0 < compressed["solve_s"] < compressed["compress_s"]
    for key in ("plan_device_bytes", "plan_host_bytes", "host_peak_bytes", "checkpoint_bytes"):
        assert compressed[key] > 0, key
    plan_phases = compressed["plan_phase_bytes"]
    assert set(plan_phases) == {"calibrate", "solve", "propagate"}
    assert compressed["plan_device_bytes"] == max(plan_phases.values())
    assert compressed["plan_peak_ratio"] is None  # no allocator peak off CUDA

    reference = steps["refmodel"]["figures"]
    cpu, device = reference["compressed_on_cpu"], reference["compressed_on_device"]
    assert cpu["perplexity"] == device["perplexity"] and reference["perplexity_gap"] == 0
    assert reference["int_weights_equal_fraction"] == 1.0
    # W4A16 on 128 evaluation tokens: within noise of the float model either way (its gap has
    # both signs across CPUs), far from a broken checkpoint's perplexity
    assert 0.9 < cpu["perplexity"] / reference["float"]["perplexity"] < 2

    assert set(record["goals"]) == {
        "compress_8b_s",
        "gptq_floor_ratio",
        "sparsegpt_floor_ratio",
        "plan_peak_ratio",
        "refmodel_plan_peak_ratio",
    }
    assert all(goal["met"] is None for goal in record["goals"].values())  # tiny shapes: not judged
    table = (out / "summary.txt").read_text()
    for needle in ("cuda tests:", "per layer", "70B down_proj", "compress, ", "refmodel W4A16"):
        assert needle in table
    ran = "did not run" if problem else "ran"
    assert f"sweep kernel against the torch loop: {ran}; differing gptq_integers 0.00%" in table


@pytest.mark.slow
def test_the_wheels_install_offline_and_run_from_the_target(tmp_path: Path) -> None:
    """Wheels built for this Python (no download: every tag fits, ``PIP_NO_INDEX`` forbids the
    registry) install into an empty folder, and a step imports llmc-trace and
    compressed-tensors from there, not from the checkout (``versions``, which every run runs
    first: it imports each package and names the folder it came from)."""
    folder, target = tmp_path / "wheels", tmp_path / "site"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    build = [sys.executable, str(GPU / "wheels.py"), "--out", str(folder), "--python-version", here]
    subprocess.run(build, cwd=REPO, check=True, capture_output=True, env=env)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {w["from"] for w in manifest["wheels"].values()} <= {
        "rebuilt from the installed files",
        "built from this checkout",
    }
    out = tmp_path / "out"
    run_gpu_script(
        "--small", "--device", "cpu", "--steps", "versions", "--budget-s", "900", "--wheels", str(folder),
        "--target", str(target), "--out", str(out), "--work", str(tmp_path / "work"), env=env,
    )  # fmt: skip
    record = json.loads((out / "gpu-benchmark.json").read_text())
    assert record["steps"]["install"]["status"] == "ok"
    packages = record["steps"]["versions"]["figures"]["packages"]
    for name in ("llmc-trace", "compressed-tensors", "pydantic", "graphviz"):
        assert packages[name]["location"].startswith(str(target)), (name, packages[name])
    assert packages["torch"]["location"].startswith(sys.prefix)  # the machine's own torch


def test_stale_wheels_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """Wheels whose manifest names other sources than the checkout's are not installed."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    manifest = {"python_version": here, "source_digest": "0" * 64, "wheels": {}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    command = [sys.executable, str(GPU / "run.py"), "--small", "--device", "cpu"]
    command += ["--wheels", str(folder), "--out", str(tmp_path / "out")]
    child = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert child.returncode != 0
    assert "built from other sources" in child.stderr
    assert not (tmp_path / "out" / "gpu-benchmark.json").exists()


def test_a_repacked_wheel_holds_the_installed_files_with_their_hashes(tmp_path: Path) -> None:
    distribution = importlib.metadata.distribution("graphviz")
    path = wheels.repack(distribution, tmp_path)
    assert path.name == f"graphviz-{distribution.version}-py3-none-any.whl"
    with zipfile.ZipFile(path) as archive:
        record = archive.read(f"graphviz-{distribution.version}.dist-info/RECORD").decode()
        rows = [line.split(",") for line in record.splitlines()]
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                continue
            data = archive.read(name)
            assert digest == record_hash(data) and int(size) == len(data)
        installed = Path(distribution.locate_file("graphviz/__init__.py")).read_bytes()
        assert archive.read("graphviz/__init__.py") == installed


@pytest.mark.parametrize(
    ("tag", "python", "fits"),
    [
        ("py3-none-any", "3.12", True),
        ("py311-none-any", "3.12", False),  # multiprocess: one wheel per Python
        ("py312-none-any", "3.12", True),
        ("cp311-cp311-manylinux_2_17_x86_64", "3.12", False),
        ("cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64", "3.12", True),
        ("cp38-abi3-manylinux_2_17_x86_64", "3.12", True),
        ("cp312-cp312-macosx_11_0_arm64", "3.12", False),
    ],
)
def test_wheel_tags_fit_only_their_pythons(tag: str, python: str, fits: bool) -> None:
    assert wheels.fits(tag, python) is fits


def test_the_carried_set_follows_requirements_and_stops_at_the_device() -> None:
    """compressed-tensors pulls pydantic and its compiled core with it; what the device has
    (torch, transformers) is neither carried nor followed; datasets is never carried."""
    on_device = wheels.device_packages()
    names = wheels.carried(["compressed-tensors>=0.19", "datasets>=3"], on_device, "3.12")
    assert {"compressed-tensors", "pydantic", "pydantic-core", "loguru"} <= set(names)
    assert not {"torch", "transformers", "sympy", "datasets", "dill"} & set(names)


def test_the_calibration_tokens_are_the_most_the_budget_holds() -> None:
    """With the 8B shape and measured-looking rates, more seconds buy more samples, a
    budget that holds none gives the fewest, and the choice fits its own prediction."""
    row = {"hessian_tokens_per_s": 2e6, "gptq_s": 0.5}
    kernels = {
        "bf16_matmul_tflops": 600.0,
        "shapes": [
            {"name": n, **row}
            for n in ("8B q/o_proj", "8B k/v_proj", "8B gate/up_proj", "8B down_proj")
        ],
    }
    shape, seq_len = llama.FULL_SHAPE, llama.FULL_SEQ_LEN
    chosen = {}
    for budget in (10.0, 200.0, 400.0, 10_000.0):
        samples, predicted = llama.choose_samples(
            llama.FULL_SAMPLES, seq_len, shape, kernels, budget
        )
        chosen[budget] = samples
        usable = budget * llama.SAFETY
        assert predicted[samples] <= usable or samples == min(llama.FULL_SAMPLES)
        larger = [n for n in llama.FULL_SAMPLES if n > samples]
        assert all(predicted[n] > usable for n in larger)
    assert chosen[10.0] == 16 and chosen[10_000.0] == 512
    assert sorted(chosen.values()) == list(chosen.values())
    assert llama.choose_samples((64, 16), seq_len, shape, {}, 1e9)[0] == 16  # nothing measured


def test_phases_take_the_seconds_until_the_next_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Label phases take the seconds to the next label, less the nested phases timed inside
    them (Hessians and solves in the calibration pass, the cache's copies only in propagation)."""
    now = iter([0.0, 1.0, 3.0, 4.0, 4.5, 5.0, 6.0, 8.0, 8.2, 8.5, 9.0, 10.0, 12.0])
    monkeypatch.setattr(phases.time, "perf_counter", lambda: next(now))
    saved = []
    meter = phases.PhaseMeter(lambda p: saved.append(dict(p)), llama.torch.device("cpu"))  # 0
    meter("load", 0, 1)  # at 1
    meter("trace", 0, 1)  # at 3
    meter("subgraph 1/2 · a", 0, 1)  # at 4
    with meter.nested("hessians"):  # 4.5 to 5
        with meter.nested("solves"):  # inside another: the outer's
            pass
    with meter.nested("solves"):  # 6 to 8
        pass
    meter("subgraph 1/2 · a · propagate", 0, 1)  # at 8.2
    with meter.nested("propagate_copy"):  # 8.5 to 9
        pass
    meter("subgraph 1/2 · a · propagate", 1, 1)  # the same label: no new phase
    meter("write", 0, 1)  # at 10
    meter.close()  # at 12
    assert meter.phases_s == pytest.approx(
        {
            "load": 2.0,
            "trace": 1.0,
            "forwards": 4.2 - 0.5 - 2.0,
            "hessians": 0.5,
            "solves": 2.0,
            "propagate_compute": 1.8 - 0.5,
            "propagate_copy": 0.5,
            "write": 2.0,
        }
    )
    assert set(saved[-1]) == set(phases.PHASES) - {"write"}


def test_a_layers_solves_peak_at_their_largest_and_the_run_keeps_the_forwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each solve resets CUDA's mark for its own reading (the report's per-layer peak) and
    the meter resets it at each phase: neither may lose what the other has not read. A CUDA
    counter simulated on the CPU; the forward pass peaks at 900, the solves at 300, 500, 200."""
    mark = [0]
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mark[0])
    monkeypatch.setattr(
        torch.cuda, "reset_peak_memory_stats", lambda device=None: mark.__setitem__(0, 0)
    )
    monkeypatch.setattr(phases, "synchronize", lambda device: None)
    cuda = torch.device("cuda")
    run = DevicePeaks()
    meter = phases.PhaseMeter(lambda p: None, cuda)
    with meter.instrumented():
        meter("subgraph 1/1 · a", 0, 1)
        mark[0] = 900
        with meter.nested("solves"):
            for nbytes in (300, 500, 200):
                with run.step(torch.device("cuda:0")):
                    mark[0] = nbytes
        meter("write", 0, 1)
        meter.close()
    assert meter.peaks["forwards"] == 900 and meter.peaks["solves"] == 500
    assert run.current(cuda) == 900


def test_a_measured_phase_is_held_against_the_plans_phase_that_covers_it() -> None:
    peaks = {"load": 9, "forwards": 50, "hessians": 60, "solves": 30, "propagate_compute": 40}
    rows = phases.phase_peaks_against_plan(peaks, {"calibrate": 80, "solve": 20, "propagate": 40})
    assert rows == {
        "calibrate": {"plan_bytes": 80, "peak_bytes": 60, "peak_over_plan": 0.75},
        "solve": {"plan_bytes": 20, "peak_bytes": 30, "peak_over_plan": 1.5},
        "propagate": {"plan_bytes": 40, "peak_bytes": 40, "peak_over_plan": 1.0},
    }


def test_goals_are_judged_on_the_full_run_only() -> None:
    llama_figures = {"compress_s": 170.0, "samples": 512, "plan_peak_ratio": 1.2}
    rows = [
        {"name": name, "gptq_floor_ratio": 1.2, "sparsegpt_floor_ratio": 1.9}
        for name in summary.GOAL_SHAPES
    ]
    rows[-1]["gptq_floor_ratio"] = 1.6
    record = {
        "mode": "full",
        "steps": {
            "llama": {"figures": llama_figures},
            "kernels": {"figures": {"shapes": rows}},
        },
    }
    judged = summary.goals(record)
    assert judged["compress_8b_s"]["met"] is True
    assert judged["gptq_floor_ratio"]["value"] == 1.6
    assert judged["gptq_floor_ratio"]["met"] is False
    assert judged["sparsegpt_floor_ratio"]["met"] is True
    assert judged["plan_peak_ratio"]["met"] is False
    assert judged["refmodel_plan_peak_ratio"]["met"] is None  # not measured
    record["steps"]["kernels"]["figures"]["shapes"] = rows[:-1]  # one shape skipped
    assert summary.goals(record)["sparsegpt_floor_ratio"]["met"] is False  # not every shape
    record["mode"] = "small"
    assert all(goal["met"] is None for goal in summary.goals(record).values())


def test_the_table_says_why_the_sweep_kernel_did_not_run() -> None:
    """A GPU run whose kernel failed to compile times the torch loop: the table names the
    reason beside the timings, or a reader takes them for slow kernels."""
    reason = "the Triton sweep kernel failed to compile (RuntimeError: PassManager::run failed)"
    agreement = {"kernel_ran": False, "fallback": reason, "gptq_integers_differing": 0.0}
    kernels = {"kernel_agreement": agreement, "sweep_kernel": False, "shapes": []}
    record = {
        "mode": "full",
        "device": "cuda",
        "steps": {"kernels": {"status": "ok", "elapsed_s": 1.0, "figures": kernels}},
    }
    record["goals"] = summary.goals(record)
    lines = summary.render(record).splitlines()
    at = lines.index(
        "sweep kernel against the torch loop: did not run; differing gptq_integers 0.00%"
    )
    assert lines[at + 1] == f"  why not: {reason}"


def test_each_cuda_tests_outcome_is_kept_as_it_finishes(tmp_path: Path) -> None:
    """The CUDA tests' step writes its JUnit report only at the end: a step killed at its
    budget keeps the outcomes already written, one JSON line per test."""
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "@pytest.mark.cuda\n"
        "def test_passes():\n    pass\n"
        "@pytest.mark.cuda\n"
        "def test_fails():\n    assert 1 == 2\n"
        "@pytest.mark.skipif(True, reason='needs a CUDA device')\n"
        "def test_skips():\n    pass\n"
        "def test_not_selected():\n    pass\n"
    )
    outcomes = tmp_path / "outcomes.jsonl"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "cuda_selection", "-p"]
    command += [
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-o",
        "markers=cuda",
        "--rootdir",
        str(tmp_path),
    ]
    command += ["--outcomes", str(outcomes), str(tmp_path / "test_some.py")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(GPU), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
    lines = [json.loads(line) for line in outcomes.read_text().splitlines()]
    assert [(line["test"].split("::")[-1], line["outcome"]) for line in lines] == [
        ("test_passes", "passed"),
        ("test_fails", "failed"),
        ("test_skips", "skipped"),
    ]
    assert lines[1]["message"].startswith("assert 1 == 2")
    assert lines[2]["message"] == "needs a CUDA device"
    record = {
        "mode": "full",
        "device": "cuda",
        "steps": {
            "cuda_tests": {
                "status": "timed out",
                "elapsed_s": 87.0,
                "figures": {
                    "finished": 3,
                    "passed": 1,
                    "failed": 1,
                    "error": 0,
                    "skipped": 1,
                    "tests": lines,
                },
            }
        },
    }
    record["goals"] = summary.goals(record)
    table = summary.render(record)
    assert (
        "cuda tests: 3 finished before the step ended: 1 passed, 1 failed, 0 error, 1 skipped"
        in table
    )
    assert "failed: " in table and "test_fails" in table


def test_a_cuda_tests_step_killed_at_its_budget_reports_what_finished(tmp_path: Path) -> None:
    """No JUnit report (the step was killed): the step's figures are the outcomes written."""
    finished = [
        {"test": "tests.test_a::test_one", "outcome": "passed", "seconds": 1.0, "message": ""},
        {"test": "tests.test_a::test_two", "outcome": "failed", "seconds": 2.0, "message": "x"},
    ]

    def killed(command: list[str], timeout: float) -> tuple[None, float]:
        outcomes = Path(command[command.index("--outcomes") + 1])
        outcomes.write_text("".join(json.dumps(line) + "\n" for line in finished))
        return None, timeout  # killed: no exit status, no report

    fake = types.SimpleNamespace(out=tmp_path, work=tmp_path, env={}, child=killed)
    result = gpu_run.cuda_tests(fake, 72.0)
    assert result["status"] == "timed out" and result["elapsed_s"] == 87.0
    figures = result["figures"]
    assert figures["finished"] == 2 and figures["tests"] == finished
    assert (figures["passed"], figures["failed"], figures["error"], figures["skipped"]) == (
        1,
        1,
        0,
        0,
    )


def test_the_table_shows_what_a_failed_run_left() -> None:
    """A run cut short (no versions, a failed step, a step killed before its figures) still
    renders, naming each step's status and error."""
    record = {
        "mode": "full",
        "device": "cuda",
        "steps": {
            "kernels": {"status": "failed", "elapsed_s": 3.0, "error": "OutOfMemoryError: x"},
            "llama": {"status": "timed out", "elapsed_s": 400.0, "figures": {"phases_s": {}}},
        },
    }
    record["goals"] = summary.goals(record)
    table = summary.render(record)
    assert "OutOfMemoryError: x" in table and "timed out" in table
    assert all(goal["met"] is None for goal in record["goals"].values())
