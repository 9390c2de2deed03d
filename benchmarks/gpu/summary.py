"""The GPU run's record held against the issue's goals, and written as a short text table.

Standard library only: ``run.py`` rewrites both after every step, a step that failed or was
skipped included, so every figure that exists is shown and a missing one reads ``-``.
"""

from __future__ import annotations

from typing import Any

GiB = 2**30
#: the issue's goals on one H100 (meaningless for the dry run's tiny shapes: not judged there)
COMPRESS_8B_S = 180.0
GPTQ_OVER_FLOOR = 2.0
PEAK_OVER_PLAN_TOLERANCE = 0.15
#: compress's phases in the order they run (the JSON sorts its keys)
PHASES = ("load", "trace", "calibrate", "propagate", "write")


def figures(record: dict[str, Any], step: str) -> dict[str, Any]:
    return record["steps"].get(step, {}).get("figures", {})


def goal(value: float | None, met: bool | None, target: str, full: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": met if full and value is not None else None}


def goals(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal's measured value, its target and whether it was met (None: not judged)."""
    full = record["mode"] == "full"
    llama = figures(record, "llama")
    shapes = figures(record, "kernels").get("shapes", [])
    seconds = llama.get("compress_s")
    ratio = max((row["gptq_over_floor"] for row in shapes), default=None)
    peak = llama.get("device_peak_over_plan")
    return {
        "compress_8b_s": goal(
            seconds,
            seconds is not None and seconds < COMPRESS_8B_S and llama.get("samples") == 512,
            f"< {COMPRESS_8B_S:.0f} s with 512 x 2048 tokens",
            full,
        ),
        "gptq_over_floor": goal(
            ratio, ratio is not None and ratio <= GPTQ_OVER_FLOOR, "<= 2 for every shape", full
        ),
        "device_peak_over_plan": goal(
            peak,
            peak is not None and abs(peak - 1) <= PEAK_OVER_PLAN_TOLERANCE,
            "within 15 % of 1",
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
    lines = [f"cuda tests: {tests['selected']} selected: {counts}"]
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
        f"per layer (bf16 inputs, fp32 Hessian); bf16 matmul "
        f"{number(kernels.get('bf16_matmul_tflops'))} TFLOP/s, fp32 "
        f"{number(kernels.get('fp32_matmul_tflops'))} TFLOP/s",
        f"{'shape':14} {'out x in':>13} {'H tokens/s':>12} {'GPTQ s':>8} {'floor s':>8} "
        f"{'ratio':>6} {'SparseGPT s':>12} {'ratio':>6}",
    ]
    for row in kernels.get("shapes", []):
        lines.append(
            f"{row['name']:14} {row['out_features']:>6} x {row['in_features']:<5} "
            f"{row['hessian_tokens_per_s']:>12,.0f} {row['gptq_s']:>8.3f} {row['floor_s']:>8.3f} "
            f"{row['gptq_over_floor']:>6.2f} {row['sparsegpt_s']:>12.3f} "
            f"{row['sparsegpt_over_floor']:>6.2f}"
        )
    if kernels.get("skipped"):
        lines.append(f"skipped (budget): {', '.join(kernels['skipped'])}")
    return lines


def llama_lines(record: dict[str, Any]) -> list[str]:
    llama = figures(record, "llama")
    if "samples" not in llama:
        return []
    phases = llama.get("phases_s", {})
    order = [p for p in PHASES if p in phases] + sorted(set(phases) - set(PHASES))
    parts = [f"{name} {phases[name]:.1f}" for name in order]
    if "solve_s" in llama:
        parts.append(f"of which solves {llama['solve_s']:.1f}")
    shape = llama["shape"]
    return [
        f"{shape['layers']}-layer Llama ({shape['hidden']} hidden) compress: "
        f"{llama['samples']} x {llama['seq_len']} tokens, {llama.get('pipeline', '-')}: "
        f"{number(llama.get('compress_s'))} s ({', '.join(parts)}); model written in "
        f"{number(llama.get('write_model_s'))} s",
        f"  device peak {gib(llama.get('device_peak_bytes'))}, plan "
        f"{gib(llama.get('plan_device_bytes'))} ({number(llama.get('device_peak_over_plan'), 2)}x); "
        f"host peak {gib(llama.get('host_peak_bytes'))}, growth "
        f"{gib(llama.get('host_growth_bytes'))}, plan {gib(llama.get('plan_host_bytes'))}",
    ]


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
        f"{'-' if equal is None else f'{100 * equal:.2f} %'}"
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
