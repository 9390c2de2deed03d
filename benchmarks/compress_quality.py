"""Compare the perplexity, seconds and memory of llmc-trace's compressors on the reference model.

The README's results table: the repository's trained reference model (``refmodel/``), calibrated on
``--samples`` rows of 512 tokens drawn from its ``calib.npy`` (``--seed``, default 0) and
evaluated on all of ``eval.npy``, one row per setting: GPTQ W4A16 (4-bit, group 128, symmetric), 3-bit group 128
and 2-bit group 64 against round-to-nearest (RTN) at the same setting, and SparseGPT 50 % and
2:4 against magnitude pruning; the fp perplexity is measured in the same run. GPTQ runs as
``compress`` runs it by default (the algorithm llm-compressor runs); the "refined" rows add
coordinate-descent refinement (``--refine-passes 20``) and the "true-sequential" rows staged
calibration, both opt-in.

Beside it, llm-compressor's GPTQ (``benchmarks/_reference/gptq_llmcompressor.py`` in
``benchmarks/.venv-llmc``) runs on the same model and the very token rows llmc-trace calibrated
on, for W4A16 and 3-bit group 128; its compressed weights are evaluated here with the same
perplexity code, after checking that they reproduce its model's logits. Printed ratios are
ours/theirs; "recovered" is the fraction of RTN's perplexity loss GPTQ wins back,
``(ppl_rtn - ppl_gptq) / (ppl_rtn - ppl_fp)``, with the same RTN run for both tools.

Every run is a fresh process (``torch.set_num_threads(2)``), so its peak resident set is its
own. Seconds: ours is the whole ``compress`` call (it loads the model, traces, plans and
calibrates; "pipeline" is the part from the first subgraph on), theirs is ``oneshot`` alone
(the model already loaded). Memory: the rise of the resident high-water mark (VmHWM, reset at
the start) over the live resident set, during ``compress`` for ours and during loading plus
``oneshot`` for theirs (the same span); theirs during ``oneshot`` alone is shown too. glibc's
allocator runs as a user's would: ours with the 4 MiB mmap threshold ``compress`` fixes
(``core/host_memory.py``), theirs with glibc's defaults; a 128 KiB threshold (as
``pipeline_memory.py`` sets to compare live bytes with a plan) made every forward pass on this
model 2-2.5x slower, which would distort the seconds.

The baseline "rtn" rounds on compressed-tensors' grid, as ``compress`` stores weights:
symmetric scale ``max|w| / ((qmax - qmin) / 2)`` per group, in the checkpoint's bf16, so 2 bits
round to [-2, 1] at ``max|w| / 1.5``. ``refmodel/README.md``'s RTN rows divide by
``2^(b-1) - 1`` in float32 instead (2 bits: ``max|w| / 1``, three levels), which costs far more
at 2 bits; the table's note quotes them from ``refmodel/results.json`` so the two never read as
one figure measured twice.

The run writes ``benchmarks/results/compress_quality.json`` (``_results.Run``; with ``--part``
``compress_quality-gptq.json`` or ``compress_quality-harsh.json``; ``--result`` names another
path): every worker's figures (perplexities, seconds, memory) for every row, each timing's
spread over the ``--repeat`` runs, and what each tool's measuring process ran with.
``tables(result)`` renders the README's tables from that file alone (``benchmarks/tables.py``),
and the tables printed at the end are the same function's output. A variant's RTN baseline is
its plain row's (the same rounding), run once.

    python benchmarks/compress_quality.py --repeat 3               # every row, ~30 min
    python benchmarks/compress_quality.py --repeat 3 --part gptq   # 4 and 3 bits, ~20 min
    python benchmarks/compress_quality.py --repeat 3 --part harsh  # the others, ~12 min
    python benchmarks/compress_quality.py --quick       # 16 samples, W4A16 only
    python benchmarks/compress_quality.py --quick --samples 128 --repeat 3  # W4A16 timing

Seconds are the median (min-max) of ``--repeat`` runs (3 by default); on a shared CPU, check
the load averages the result records before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _worker
import numpy as np
from _environment import SAME_FOR_A_RATIO, describe
from _results import Run, spread, spread_text
from _rss import peak_rss_since_reset, reset_peak_rss
from refmodel import FOLDER as DEFAULT_MODEL

MiB = 1024 * 1024
HERE = Path(__file__).resolve().parent
REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_SCRIPT = HERE / "_reference" / "gptq_llmcompressor.py"
SEQ_LEN = 512
THREADS = 2
#: Attention kernel for every side: ``compress``'s default, llm-compressor's model, evaluation.
ATTENTION = "sdpa"
EVAL_BATCH_SIZE = 8


@dataclass(frozen=True)
class Setting:
    """One table row: our method and its data-free baseline at the same bits or sparsity."""

    label: str
    method: str  # "gptq" or "sparsegpt"
    baseline: str  # "rtn" or "magnitude"
    bits: int | None = None
    group_size: int | None = None
    sparsity: str | None = None
    true_sequential: bool = False
    refine_passes: int | None = None  # None: compress's default (no refinement)
    #: two stages: prune (``method``/``baseline`` at ``sparsity``), then quantize the pruned
    #: model at ``bits``/``group_size`` (GPTQ after SparseGPT, RTN after magnitude)
    then_quantize: bool = False

    @property
    def is_variant(self) -> bool:
        """A variant of a row above it (refined or true-sequential), compared with the same
        llm-compressor runs as that row."""
        return self.true_sequential or self.refine_passes is not None

    @property
    def has_reference(self) -> bool:
        """Whether llm-compressor's GPTQ runs beside ours (W4A16 and 3-bit group 128)."""
        return self.method == "gptq" and self.bits in (3, 4) and not self.is_variant

    @property
    def part(self) -> str:
        """``gptq``: the rows beside llm-compressor (4 and 3 bits, with their variants);
        ``harsh``: the others (2 bits, sparsity, two stages)."""
        return "gptq" if self.method == "gptq" and self.bits in (3, 4) else "harsh"

    @property
    def baseline_key(self) -> tuple[Any, ...]:
        """What decides the data-free baseline: a variant shares its plain row's."""
        return (self.baseline, self.bits, self.group_size, self.sparsity, self.then_quantize)


SETTINGS = (
    Setting("W4A16 (4-bit g128 sym)", "gptq", "rtn", bits=4, group_size=128),
    Setting("3-bit g128", "gptq", "rtn", bits=3, group_size=128),
    Setting("W4A16, refined", "gptq", "rtn", bits=4, group_size=128, refine_passes=20),
    Setting("3-bit g128, refined", "gptq", "rtn", bits=3, group_size=128, refine_passes=20),
    Setting("W4A16, true-sequential", "gptq", "rtn", bits=4, group_size=128, true_sequential=True),
    Setting(
        "3-bit g128, true-sequential", "gptq", "rtn", bits=3, group_size=128, true_sequential=True
    ),
    Setting("2-bit g64", "gptq", "rtn", bits=2, group_size=64),
    Setting("SparseGPT 50%", "sparsegpt", "magnitude", sparsity="0.5"),
    Setting("SparseGPT 2:4", "sparsegpt", "magnitude", sparsity="2:4"),
    Setting(
        "2:4, then W4A16",
        "sparsegpt",
        "magnitude",
        bits=4,
        group_size=128,
        sparsity="2:4",
        then_quantize=True,
    ),
)


PARTS = ("gptq", "harsh")

# ---- measurement, inside each fresh process -------------------------------------------------


def measure_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one ``compress`` (and, if asked, evaluate its model); seconds and memory."""
    import torch

    from llmc_trace.algorithms.scheme import W4A16
    from llmc_trace.evaluate import perplexity
    from llmc_trace.oneshot import CompressRequest, Stage, compress

    torch.set_num_threads(THREADS)
    environment = describe(["llmc-trace", "compressed-tensors"])
    model_dir = Path(spec["model_dir"])
    scheme = (
        W4A16.with_weights(num_bits=spec["bits"], group_size=spec["group_size"])
        if spec["bits"] is not None
        else None
    )
    first_subgraph_at: list[float] = []

    def note_pipeline_start(description: str, done: int, total: int) -> None:
        if description not in ("load", "trace") and not first_subgraph_at:
            first_subgraph_at.append(time.perf_counter())

    before_peak = peak_rss_since_reset()  # imports' peak, lost by the reset below
    before = reset_peak_rss()
    start = time.perf_counter()
    options: dict[str, Any] = {
        "scheme": scheme,
        "method": spec["method"],
        "sparsity": spec["sparsity"],
        "true_sequential": spec["true_sequential"],
    }
    if spec["refine_passes"] is not None:
        options["refine_passes"] = spec["refine_passes"]
    if spec["then_quantize"]:
        quantizer = "gptq" if spec["method"] == "sparsegpt" else "rtn"
        prune = Stage(spec["method"], None, spec["sparsity"])
        options = {"stages": (prune, Stage(quantizer, scheme))}
    request = CompressRequest(
        model_dir,
        dataset=model_dir / "calib.npy",
        samples=spec["samples"],
        seq_len=SEQ_LEN,
        batch_size=spec["batch_size"],
        seed=spec["seed"],
        attn_implementation=ATTENTION,
        **options,
    )
    result = compress(request, progress=note_pipeline_start)
    end = time.perf_counter()
    peak = peak_rss_since_reset()
    measured: dict[str, Any] = {
        "compress_s": end - start,
        "pipeline_s": end - first_subgraph_at[0] if first_subgraph_at else None,
        "pipeline": result.pipeline,
        "layers": len(result.layers),
        "compress_rss_bytes": peak - before,
        "peak_rss_bytes": max(before_peak, peak),
        "environment": environment,
    }
    if spec["evaluate"]:
        tokens = np.load(model_dir / "eval.npy")
        # the model keeps the checkpoint's bf16; scored in float32 like every other row
        model = result.model.float()
        measured["ppl"] = perplexity(model, tokens, batch_size=EVAL_BATCH_SIZE).perplexity
    return measured


def load_float32(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=ATTENTION
    ).eval()


def measure_weights(spec: dict[str, Any]) -> dict[str, Any]:
    """Perplexity of the model with the Linear weights saved by the reference run, on the
    first ``eval_rows`` rows of ``eval.npy`` where the spec names them (all otherwise).

    The saved logits of one row, computed by llm-compressor's own model, must come back: the
    largest absolute difference is reported so a mismatch cannot pass unseen.
    """
    import torch

    from llmc_trace.evaluate import perplexity

    torch.set_num_threads(THREADS)
    model_dir = Path(spec["model_dir"])
    model = load_float32(model_dir)
    saved = torch.load(spec["weights"])
    missing = set(saved["weights"]) - set(model.state_dict())
    assert not missing, f"saved weights the model does not have: {sorted(missing)[:3]}"
    model.load_state_dict(saved["weights"], strict=False)
    measured: dict[str, Any] = {}
    if saved["check"]:
        with torch.no_grad():
            logits = model(input_ids=saved["check"]["input_ids"]).logits.float()
        measured["max_abs_logit_diff"] = (logits - saved["check"]["logits"]).abs().max().item()
    tokens = np.load(model_dir / "eval.npy")[: spec.get("eval_rows")]
    measured["ppl"] = perplexity(model, tokens, batch_size=EVAL_BATCH_SIZE).perplexity
    return measured


def measure_fp(spec: dict[str, Any]) -> dict[str, Any]:
    """Perplexity of the uncompressed model (bf16 weights in float32)."""
    import torch

    from llmc_trace.evaluate import perplexity

    torch.set_num_threads(THREADS)
    model_dir = Path(spec["model_dir"])
    tokens = np.load(model_dir / "eval.npy")
    return {"ppl": perplexity(load_float32(model_dir), tokens, EVAL_BATCH_SIZE).perplexity}


WORKERS = {"ours": measure_ours, "weights": measure_weights, "fp": measure_fp}


# ---- orchestration, in the parent process ---------------------------------------------------


def child_environment() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_child(command: list[str], what: str) -> dict[str, Any]:
    return _worker.run_child(command, what, child_environment())


def run_worker(kind: str, spec: dict[str, Any], what: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, json.dumps(spec)]
    return run_child(command, what)


def run_ours(
    model_dir: Path,
    method: str,
    setting: Setting,
    samples: int,
    seed: int,
    evaluate: bool,
    batch_size: int = 1,
) -> dict[str, Any]:
    spec = {
        "seed": seed,
        "batch_size": batch_size,
        "model_dir": str(model_dir),
        "method": method,
        "bits": setting.bits,
        "group_size": setting.group_size,
        "sparsity": setting.sparsity,
        "true_sequential": setting.true_sequential,
        "refine_passes": setting.refine_passes,
        "then_quantize": setting.then_quantize,
        "samples": samples,
        "evaluate": evaluate,
    }
    result = run_worker("ours", spec, f"{setting.label} {method}")
    if "error" not in result:
        ppl = f", ppl {result['ppl']:.3f}" if "ppl" in result else ""
        print(
            f"  {setting.label:24} {method:10} {result['compress_s']:7.1f} s "
            f"({result['pipeline']}), +{result['compress_rss_bytes'] / MiB:.0f} MiB{ppl}",
            flush=True,
        )
    return result


def run_theirs(
    model_dir: Path, setting: Setting, calib_rows: Path, save: Path | None, batch_size: int = 1
) -> dict[str, Any]:
    command = [str(REFERENCE_PYTHON), str(REFERENCE_SCRIPT), str(model_dir), str(calib_rows)]
    command += ["--bits", str(setting.bits), "--group-size", str(setting.group_size)]
    command += ["--batch-size", str(batch_size)]
    command += ["--threads", str(THREADS), "--attn-implementation", ATTENTION]
    if save is not None:
        check_row = save.with_suffix(".row.npy")
        np.save(check_row, np.load(model_dir / "eval.npy")[0])
        command += ["--save", str(save), "--check-row", str(check_row)]
    result = run_child(command, f"{setting.label} llm-compressor")
    if "error" in result:
        return result
    if save is not None:
        spec = {"model_dir": str(model_dir), "weights": str(save)}
        result.update(run_worker("weights", spec, f"{setting.label} llm-compressor eval"))
    ppl = f", ppl {result['ppl']:.3f}" if "ppl" in result else ""
    print(
        f"  {setting.label:24} {'llm-comp.':10} {result['oneshot_s']:7.1f} s "
        f"(oneshot), +{result['load_and_oneshot_rss_bytes'] / MiB:.0f} MiB{ppl}",
        flush=True,
    )
    return result


def save_calibration_rows(model_dir: Path, samples: int, seed: int, path: Path) -> None:
    """The exact token rows ``compress`` calibrates on, in its order, for llm-compressor."""
    import torch

    from llmc_trace.data import load_calibration

    calibration = load_calibration(
        model_dir / "calib.npy", samples=samples, seq_len=SEQ_LEN, seed=seed
    )
    rows = torch.cat([batch["input_ids"] for batch in calibration.batches])  # (samples, T)
    np.save(path, rows.numpy())


def values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [run[key] for run in runs if run.get(key) is not None]


def spread_of(runs: list[dict[str, Any]], key: str, unit: float = 1.0) -> dict[str, Any] | None:
    """``key`` over the runs that measured it, divided by ``unit``; None when none did."""
    measured = values(runs, key)
    if not measured:
        return None
    return spread([v / unit for v in measured], digits=2 if unit == MiB else 4)


def summary(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """A row's repeats as spreads: what its tables show (seconds, MiB)."""
    return {
        "ours_compress_s": spread_of(ours, "compress_s"),
        "ours_pipeline_s": spread_of(ours, "pipeline_s"),
        "ours_mib": spread_of(ours, "compress_rss_bytes", MiB),
        "ours_peak_mib": spread_of(ours, "peak_rss_bytes", MiB),
        "theirs_oneshot_s": spread_of(theirs, "oneshot_s"),
        "theirs_mib": spread_of(theirs, "load_and_oneshot_rss_bytes", MiB),
        "theirs_oneshot_mib": spread_of(theirs, "oneshot_rss_bytes", MiB),
        "theirs_before_oneshot_mib": spread_of(theirs, "rss_before_oneshot_bytes", MiB),
        "theirs_peak_mib": spread_of(theirs, "peak_rss_bytes", MiB),
    }


def without_environment(run: dict[str, Any], seen: dict[str, Any], key: str) -> dict[str, Any]:
    """``run`` less its ``environment``, which is kept once per tool in ``seen[key]``."""
    run = dict(run)
    environment = run.pop("environment", None)
    if environment is not None:
        seen.setdefault(key, environment)
    return run


def row_figures(
    setting: Setting,
    baseline: dict[str, Any],
    ours: list[dict[str, Any]],
    theirs: list[dict[str, Any]],
    variant_of: str | None,
) -> dict[str, Any]:
    """One row of the result: the setting, every run, and the spreads the tables show.

    A variant shares its plain row's llm-compressor runs (``variant_of`` names that row); its
    own ``theirs`` stays empty, so each reference run is stored once."""
    return {
        "label": setting.label,
        "method": setting.method,
        "baseline_method": setting.baseline,
        "bits": setting.bits,
        "group_size": setting.group_size,
        "sparsity": setting.sparsity,
        "true_sequential": setting.true_sequential,
        "refine_passes": setting.refine_passes,
        "then_quantize": setting.then_quantize,
        "variant_of": variant_of,
        "baseline": baseline,
        "ours": ours,
        "theirs": theirs,
        "summary": summary(ours, theirs),
    }


def refmodel_rtn(model_dir: Path) -> list[dict[str, Any]]:
    """``refmodel/results.json``'s RTN rows (another rounding rule), for the table's note."""
    path = model_dir / "results.json"
    if not path.is_file():
        return []
    rows = json.loads(path.read_text()).get("results", [])
    return [
        {"config": r["config"], "bits": r["bits"], "group_size": r["group_size"],
         "ppl": r["eval_ppl"]}
        for r in rows if r.get("bits")
    ]  # fmt: skip


# ---- the tables, from the result file alone -------------------------------------------------


def ppl_text(run: dict[str, Any] | None) -> str:
    return f"{run['ppl']:.3f}" if run and "ppl" in run else "failed"


def recovered(baseline: dict[str, Any], compressed: dict[str, Any] | None, fp_ppl: float) -> str:
    if not compressed or "ppl" not in compressed or "ppl" not in baseline:
        return "-"
    return f"{(baseline['ppl'] - compressed['ppl']) / (baseline['ppl'] - fp_ppl):.1%}"


def ratio_text(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    """ours / theirs of two spreads' medians, measured in the same run."""
    if not ours or not theirs:
        return "-"
    return f"{ours['median'] / theirs['median']:.2f}x"


def reference_runs(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row whose llm-compressor runs ``row`` is compared with: itself or its plain row."""
    if row["variant_of"] is None:
        return row
    return next(r for r in rows if r["label"] == row["variant_of"])


def rtn_note(figures: dict[str, Any]) -> str:
    """Which rounding rule "rtn" is, and refmodel/README.md's RTN figures under its own."""
    note = (
        "rtn: round-to-nearest on compressed-tensors' grid, as `compress` stores weights "
        "(symmetric scale max|w| / ((qmax - qmin) / 2) per group, in the checkpoint's bf16; "
        "2 bits round to [-2, 1] at max|w| / 1.5)."
    )
    other = figures.get("refmodel_rtn") or []
    if other:
        quoted = ", ".join(f"{r['config']} {r['ppl']:.3f}" for r in other)
        note += (
            " `refmodel/README.md`'s RTN divides by 2^(b-1) - 1 in float32 (2 bits: max|w| / 1, "
            f"three levels), another rule: {quoted}."
        )
    return note


def quality_table(figures: dict[str, Any]) -> str:
    rows, fp_ppl, repeat = figures["rows"], figures["fp_ppl"], figures["repeat"]
    timing = "ours seconds" + (f", median (min-max) of {repeat}" if repeat > 1 else "")
    lines = [
        f"| setting | baseline ppl | ours ppl | fp ppl | {timing} |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        name = row["baseline_method"] + (", then rtn" if row["then_quantize"] else "")
        ours = row["ours"][0] if row["ours"] else None
        seconds = spread_text(row["summary"]["ours_compress_s"])
        lines.append(
            f"| {row['label']} | {ppl_text(row['baseline'])} ({name}) | {ppl_text(ours)} "
            f"| {fp_ppl:.3f} | {seconds} |"
        )
    first = rows[0]
    if first["bits"] == 4 and first["method"] == "gptq" and first["ours"]:
        lines += [
            "",
            f"W4A16: GPTQ recovers {recovered(first['baseline'], first['ours'][0], fp_ppl)} of "
            "RTN's perplexity loss ((ppl_rtn - ppl_gptq) / (ppl_rtn - ppl_fp)).",
        ]
    if any(row["baseline_method"] == "rtn" or row["then_quantize"] for row in rows):
        lines += ["", rtn_note(figures)]
    return "\n".join(lines)


def side_by_side_table(figures: dict[str, Any]) -> str:
    rows, fp_ppl = figures["rows"], figures["fp_ppl"]
    lines = [
        "| setting | ppl ours / theirs | recovered ours / theirs | seconds ours | seconds theirs "
        "| ours/theirs s | MiB ours | MiB theirs | ours/theirs MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        reference = reference_runs(row, rows)
        if not reference["theirs"]:
            continue
        ours, theirs = (row["ours"][0] if row["ours"] else None), reference["theirs"][0]
        mine, other = row["summary"], reference["summary"]
        lines.append(
            f"| {row['label']} | {ppl_text(ours)} / {ppl_text(theirs)} "
            f"| {recovered(row['baseline'], ours, fp_ppl)} / "
            f"{recovered(row['baseline'], theirs, fp_ppl)} "
            f"| {spread_text(mine['ours_compress_s'])} | {spread_text(other['theirs_oneshot_s'])} "
            f"| {ratio_text(mine['ours_compress_s'], other['theirs_oneshot_s'])} "
            f"| {spread_text(mine['ours_mib'], '.0f')} | {spread_text(other['theirs_mib'], '.0f')} "
            f"| {ratio_text(mine['ours_mib'], other['theirs_mib'])} |"
        )
    return "\n".join(lines)


def details_table(figures: dict[str, Any]) -> str:
    """What the side-by-side leaves out, for the rows that ran llm-compressor themselves."""
    lines = [
        "| setting | ours from the first subgraph on, s | theirs during oneshot alone, +MiB "
        "| theirs resident before oneshot, MiB | whole-process peak MiB ours / theirs "
        "| theirs' saved weights reproduce their logits to |",
        "|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        if not row["theirs"]:
            continue
        s = row["summary"]
        diffs = values(row["theirs"], "max_abs_logit_diff")
        lines.append(
            f"| {row['label']} | {spread_text(s['ours_pipeline_s'])} "
            f"| {spread_text(s['theirs_oneshot_mib'], '.0f')} "
            f"| {spread_text(s['theirs_before_oneshot_mib'], '.0f')} "
            f"| {spread_text(s['ours_peak_mib'], '.0f')} / "
            f"{spread_text(s['theirs_peak_mib'], '.0f')} "
            f"| {f'{diffs[0]:.2e}' if diffs else '-'} |"
        )
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The README's tables from a result file: ``quality`` (every row against its data-free
    baseline), and with llm-compressor ``side_by_side`` and ``details`` (its memory apart)."""
    figures = result["figures"]
    rendered = {"quality": quality_table(figures)}
    if any(row["theirs"] for row in figures["rows"]):
        rendered["side_by_side"] = side_by_side_table(figures)
        rendered["details"] = details_table(figures)
    return rendered


def print_tables(document: dict[str, Any]) -> None:
    rendered = tables(document)
    titles = {
        "side_by_side": "Side by side with llm-compressor's GPTQ (same model, same calibration "
        "rows):",
        "details": "Details (median (min-max) over runs):",
    }
    for key, table in rendered.items():
        print(f"\n{titles[key]}\n" if key in titles else "")
        print(table)


# ---- the run ---------------------------------------------------------------------------------


def measure_rows(
    settings: tuple[Setting, ...],
    model_dir: Path,
    samples: int,
    seed: int,
    repeat: int,
    reference: bool,
    environments: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every setting's baseline, ``repeat`` runs of ours and (where it runs) of theirs."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="compress_quality_") as folder:
        calib_rows = Path(folder) / "calib_rows.npy"
        if reference:
            save_calibration_rows(model_dir, samples, seed, calib_rows)
        baselines: dict[tuple[Any, ...], dict[str, Any]] = {}
        for setting in settings:
            if setting.baseline_key not in baselines:
                run = run_ours(model_dir, setting.baseline, setting, samples, seed, evaluate=True)
                baselines[setting.baseline_key] = without_environment(run, {}, "")
            baseline = baselines[setting.baseline_key]
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            for index in range(repeat):
                run = run_ours(model_dir, setting.method, setting, samples, seed, index == 0)
                ours.append(without_environment(run, environments, "llmc-trace worker"))
                if reference and setting.has_reference:
                    save = Path(folder) / f"theirs_{setting.bits}bit.pt" if index == 0 else None
                    run = run_theirs(model_dir, setting, calib_rows, save)
                    theirs.append(without_environment(run, environments, "llm-compressor worker"))
            variant_of = None
            if setting.is_variant:  # the same llm-compressor runs as its plain row
                variant_of = next(
                    (
                        r["label"]
                        for r in rows
                        if (r["bits"], r["group_size"]) == (setting.bits, setting.group_size)
                        and r["theirs"]
                    ),
                    None,
                )
            rows.append(row_figures(setting, baseline, ours, theirs, variant_of))
    return rows


def ratio_notes(environments: dict[str, Any]) -> list[str]:
    """A sentence when the two tools' measuring processes differ where a ratio needs them equal."""
    mine = environments.get("llmc-trace worker")
    theirs = environments.get("llm-compressor worker")
    if not mine or not theirs:
        return []
    differing = [
        f"{key} {mine[key]} vs {theirs[key]}"
        for key in SAME_FOR_A_RATIO
        if mine.get(key) != theirs.get(key)
    ]
    if not differing:
        return []
    return ["The two tools ran on different builds (" + "; ".join(differing) + ")."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--samples", type=int, help="calibration rows (default 128; 16 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="W4A16 only, 16 samples by default")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per method (default 3)")
    parser.add_argument(
        "--seed", type=int, default=0, help="which calibration rows are drawn (default 0)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="TEXT", help="rows whose label contains any of these"
    )
    parser.add_argument(
        "--part", choices=PARTS, help="only the rows beside llm-compressor (gptq: 4 and 3 "
        "bits with their variants) or the others (harsh); the result is named after it",
    )
    parser.add_argument(
        "--result", type=Path, help="where the result goes (default benchmarks/results/"
        "compress_quality.json, or compress_quality-PART.json)",
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(WORKERS[args.worker](json.loads(args.spec))), flush=True)
        return
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    run = Run("compress_quality" + (f"-{args.part}" if args.part else ""))
    samples = args.samples or (16 if args.quick else 128)
    settings = SETTINGS[:1] if args.quick else SETTINGS
    if args.part:
        settings = tuple(s for s in settings if s.part == args.part)
    if args.only:
        settings = tuple(s for s in settings if any(text in s.label for text in args.only))
        if not settings:
            parser.error(f"no row's label contains {' or '.join(args.only)}")
    reference = REFERENCE_PYTHON.exists()
    model_dir = args.model_dir.resolve()

    print(f"refmodel {model_dir}; {samples} x {SEQ_LEN} calibration tokens (seed {args.seed})")
    print(f"{THREADS} torch threads per run; {args.repeat} timed run(s) per method")
    if not reference:
        print(
            f"no {REFERENCE_PYTHON}: llm-compressor is skipped (bash benchmarks/reference_env.sh)"
        )
    print(f"load average at start: {run.load_before} on {os.cpu_count()} CPUs")
    fp = run_worker("fp", {"model_dir": str(model_dir)}, "fp")
    fp_ppl = fp.get("ppl", float("nan"))
    print(f"  fp perplexity {fp_ppl:.3f}", flush=True)

    environments: dict[str, Any] = {}
    rows = measure_rows(
        settings, model_dir, samples, args.seed, args.repeat, reference, environments
    )
    figures = {
        "model": "refmodel",
        "samples": samples,
        "seq_len": SEQ_LEN,
        "seed": args.seed,
        "repeat": args.repeat,
        "part": args.part,
        "threads": THREADS,
        "attention": ATTENTION,
        "eval_rows": int(np.load(model_dir / "eval.npy").shape[0]),
        "eval_batch_size": EVAL_BATCH_SIZE,
        "reference": reference,
        "fp_ppl": fp_ppl,
        "rows": rows,
        "refmodel_rtn": refmodel_rtn(model_dir),
    }
    path = run.write(
        figures, environments=environments, notes=ratio_notes(environments), path=args.result
    )
    document = json.loads(path.read_text())
    print_tables(document)
    print(f"\nload average at end: {document['load_average']['after']}; {document['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
