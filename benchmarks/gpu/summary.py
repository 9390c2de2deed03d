"""The GPU run's record held against the issue's goals, and written as a short text table.

Standard library only: ``run.py`` rewrites both after every step, a step that failed or was
skipped included, so every figure that exists is shown and a missing one reads ``-``.
"""

from __future__ import annotations

from typing import Any

GiB = 2**30
#: the goals on one H200 (meaningless for the dry run's tiny shapes: not judged there)
COMPRESS_8B_S = 180.0
GPTQ_FLOOR_RATIO = 1.5
SPARSEGPT_FLOOR_RATIO = 2.0
PLAN_PEAK_TOLERANCE = 0.15
#: every shape the floor goals cover (``kernel_speed.FULL_SHAPES``' names)
GOAL_SHAPES = (
    "8B q/o_proj", "8B k/v_proj", "8B gate/up_proj", "8B down_proj",
    "70B q/o_proj", "70B k/v_proj", "70B gate/up_proj", "70B down_proj",
)  # fmt: skip
#: compress's phases in the order they run (the JSON sorts its keys)
PHASES = (
    "load", "trace", "forwards", "hessians", "solves", "propagate_compute", "propagate_copy",
    "write",
)  # fmt: skip


def figures(record: dict[str, Any], step: str) -> dict[str, Any]:
    return record["steps"].get(step, {}).get("figures", {})


def goal(value: float | None, met: bool | None, target: str, full: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": met if full and value is not None else None}


def worst_ratio(shapes: list[dict[str, Any]], key: str, limit: float) -> tuple[float | None, bool]:
    """The largest ``key`` over the measured shapes, and whether every goal shape was measured
    and within ``limit`` (a shape the budget skipped cannot meet the goal)."""
    ratios = {row["name"]: row[key] for row in shapes if key in row}
    worst = max(ratios.values(), default=None)
    every = set(GOAL_SHAPES) <= set(ratios)
    return worst, every and worst is not None and worst <= limit


def goals(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal's measured value, its target and whether it was met (None: not judged)."""
    full = record["mode"] == "full"
    llama = figures(record, "llama")
    shapes = figures(record, "kernels").get("shapes", [])
    seconds = llama.get("compress_s")
    gptq, gptq_met = worst_ratio(shapes, "gptq_floor_ratio", GPTQ_FLOOR_RATIO)
    sparse, sparse_met = worst_ratio(shapes, "sparsegpt_floor_ratio", SPARSEGPT_FLOOR_RATIO)
    peak = llama.get("plan_peak_ratio")
    refmodel = figures(record, "refmodel").get("plan_peak_ratio")
    return {
        "compress_8b_s": goal(
            seconds,
            seconds is not None
            and seconds < COMPRESS_8B_S
            and llama.get("samples") == 512
            and llama.get("propagate", True),
            f"< {COMPRESS_8B_S:.0f} s with 512 x 2048 tokens, error propagation on",
            full,
        ),
        "gptq_floor_ratio": goal(
            gptq, gptq_met, f"<= {GPTQ_FLOOR_RATIO} on every 8B and 70B shape (median of 5)", full
        ),
        "sparsegpt_floor_ratio": goal(
            sparse,
            sparse_met,
            f"<= {SPARSEGPT_FLOOR_RATIO:.0f} on every 8B and 70B shape, 50 % and 2:4 (median of 5)",
            full,
        ),
        "plan_peak_ratio": goal(
            peak,
            peak is not None and abs(peak - 1) <= PLAN_PEAK_TOLERANCE,
            "8B run's device peak within 15 % of the plan",
            full,
        ),
        "refmodel_plan_peak_ratio": goal(
            refmodel,
            refmodel is not None and abs(refmodel - 1) <= PLAN_PEAK_TOLERANCE,
            "reference model's device peak within 15 % of the plan",
            full,
        ),
    }


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def gib(count: int | None) -> str:
    return "-" if count is None else f"{count / GiB:.2f} GiB"


def header(record: dict[str, Any]) -> list[str]:
    versions = figures(record, "versions")
    packages = versions.get("packages", {})

    def version(name: str) -> str:
        return str(packages.get(name, {}).get("version"))

    ours = packages.get("llmc-trace", {})
    lines = [
        f"llmc-trace GPU run ({record['mode']}) on {versions.get('name', record['device'])}: "
        f"torch {version('torch')}, transformers {version('transformers')}, "
        f"compressed-tensors {version('compressed-tensors')}, "
        f"llmc-trace {ours.get('version')} from {ours.get('location')}",
        f"unmet requirements: {'; '.join(versions.get('unmet_requirements', [])) or 'none'}",
        "",
        f"{'step':12} {'status':14} {'seconds':>8} {'budget':>7}",
    ]
    for name, step in record["steps"].items():
        budget = step.get("budget_s")
        lines.append(
            f"{name:12} {step.get('status', '-'):14} {number(step.get('elapsed_s')):>8} "
            f"{number(budget, 0) if budget is not None else '-':>7}"
            + (f"  {step['error']}" if step.get("error") else "")
        )
    return lines


def test_lines(record: dict[str, Any]) -> list[str]:
    tests = figures(record, "cuda_tests")
    if not tests:
        return []
    counts = ", ".join(f"{tests[k]} {k}" for k in ("passed", "failed", "error", "skipped"))
    if "selected" in tests:
        lines = [f"cuda tests: {tests['selected']} selected: {counts}"]
    else:  # the step was killed: what finished before
        lines = [f"cuda tests: {tests['finished']} finished before the step ended: {counts}"]
    lines += [
        f"  {t['outcome']}: {t['test']}: {t['message']}"
        for t in tests["tests"]
        if t["outcome"] in ("failed", "error")
    ]
    return lines


def kernel_lines(record: dict[str, Any]) -> list[str]:
    kernels = figures(record, "kernels")
    if not kernels:
        return []
    lines = [
        f"per layer (bf16 inputs, fp32 Hessian), medians of {kernels.get('repeats', '-')} "
        f"(spread: slowest over fastest - 1); sweep kernel {kernels.get('sweep_kernel')}; "
        f"matmul bf16 {number(kernels.get('bf16_matmul_tflops'))}, fp32 "
        f"{number(kernels.get('fp32_matmul_tflops'))}, tf32 "
        f"{number(kernels.get('tf32_matmul_tflops'))} TFLOP/s",
        *agreement_lines(kernels),
        f"{'shape':17} {'out x in':>13} {'H TFLOP/s':>9} {'of peak':>7} {'floor s':>8} "
        f"{'GPTQ s':>8} {'x':>5} {'spread':>6} {'SpGPT s':>8} {'2:4 s':>8} {'x':>5} {'spread':>6}",
    ]
    for row in kernels.get("shapes", []):
        lines.append(
            f"{row['name']:17} {row['out_features']:>6} x {row['in_features']:<5} "
            f"{row['hessian_tflops']:>9.1f} {row['hessian_over_matmul_peak']:>7.0%} "
            f"{row['floor_s']:>8.3f} {row['gptq_s']:>8.3f} {row['gptq_floor_ratio']:>5.2f} "
            f"{row['gptq']['spread']:>6.0%} {row['sparsegpt_s']:>8.3f} "
            f"{row['sparsegpt_2of4_s']:>8.3f} {row['sparsegpt_floor_ratio']:>5.2f} "
            f"{max(row['sparsegpt']['spread'], row['sparsegpt_2of4']['spread']):>6.0%}"
        )
    if kernels.get("skipped"):
        lines.append(f"skipped (budget): {', '.join(kernels['skipped'])}")
    return lines


def agreement_lines(kernels: dict[str, Any]) -> list[str]:
    """The sweep kernel held against the torch loop, and why it did not run where it did not:
    without this line a GPU run whose kernel failed to compile reads as slow kernels."""
    agreement = kernels.get("kernel_agreement") or {}
    lines = []
    if "skipped" in agreement:
        lines.append(f"sweep kernel against the torch loop: skipped ({agreement['skipped']})")
    elif agreement:
        differing = {
            k.removesuffix("_differing"): v
            for k, v in agreement.items()
            if k.endswith("_differing")
        }
        shares = ", ".join(f"{name} {share:.2%}" for name, share in differing.items())
        ran = "ran" if agreement.get("kernel_ran") else "did not run"
        lines.append(f"sweep kernel against the torch loop: {ran}; differing {shares}")
        if agreement.get("fallback"):
            lines.append(f"  why not: {agreement['fallback']}")
    return lines


def llama_lines(record: dict[str, Any]) -> list[str]:
    llama = figures(record, "llama")
    if "samples" not in llama:
        return []
    shape = llama["shape"]
    lines = [
        f"{shape['layers']}-layer Llama ({shape['hidden']} hidden) compress, "
        f"{llama['samples']} x {llama['seq_len']} tokens; model written in "
        f"{number(llama.get('write_model_s'))} s"
    ]
    for key, run in llama.get("runs", {}).items():
        phases = run.get("phases_s", {})
        order = [p for p in PHASES if p in phases] + sorted(set(phases) - set(PHASES))
        parts = ", ".join(f"{name} {phases[name]:.1f}" for name in order)
        lines.append(
            f"  {key}: {run.get('pipeline', '-')} {number(run.get('compress_s'))} s ({parts})"
        )
        against = run.get("phases_against_plan") or {}
        planned = "; ".join(
            f"{phase} {gib(row['peak_bytes'])} of {gib(row['plan_bytes'])}"
            for phase, row in against.items()
        )
        lines.append(
            f"    device peak {gib(run.get('device_peak_bytes'))}, plan "
            f"{gib(run.get('plan_device_bytes'))} ({number(run.get('plan_peak_ratio'), 2)}x); "
            f"per phase {planned}; host peak {gib(run.get('host_peak_bytes'))}, growth "
            f"{gib(run.get('host_growth_bytes'))}, plan {gib(run.get('plan_host_bytes'))}"
        )
    if llama.get("skipped"):
        lines.append(f"  skipped (budget): {', '.join(llama['skipped'])}")
    return lines


def reference_lines(record: dict[str, Any]) -> list[str]:
    reference = figures(record, "refmodel")
    if "float" not in reference:
        return []
    cpu = reference.get("compressed_on_cpu", {})
    device = reference.get("compressed_on_device", {})
    gap = reference.get("perplexity_gap")
    equal = reference.get("int_weights_equal_fraction")
    return [
        f"refmodel W4A16 ({reference['samples']} x {reference['seq_len']} calibration, "
        f"{reference['eval_rows']} rows scored on {reference['eval_device']}): float "
        f"{number(reference['float']['perplexity'], 3)}; compressed on cpu "
        f"{number(cpu.get('perplexity'), 3)} ({number(cpu.get('compress_s'))} s), on "
        f"{device.get('compress_device', '-')} {number(device.get('perplexity'), 3)} "
        f"({number(device.get('compress_s'))} s); gap "
        f"{'-' if gap is None else f'{100 * gap:+.3f} %'}; integers equal "
        f"{'-' if equal is None else f'{100 * equal:.2f} %'}; device peak "
        f"{gib(reference.get('device_peak_bytes'))}, plan {gib(reference.get('plan_device_bytes'))} "
        f"({number(reference.get('plan_peak_ratio'), 2)}x)"
    ]


def render(record: dict[str, Any]) -> str:
    """The record as a short text table (``summary.txt``)."""
    lines = header(record)
    for section in (test_lines, kernel_lines, llama_lines, reference_lines):
        part = section(record)
        if part:
            lines += ["", *part]
    judged = []
    for name, entry in record.get("goals", {}).items():
        verdict = {True: "met", False: "MISSED", None: "not judged"}[entry["met"]]
        judged.append(f"{name} {number(entry['value'], 2)} ({entry['target']}): {verdict}")
    lines += ["", "goals: " + "; ".join(judged)]
    return "\n".join(lines)
