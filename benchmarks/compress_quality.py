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

    python benchmarks/compress_quality.py               # 20-40 min on 2 cores, load permitting
    python benchmarks/compress_quality.py --quick       # 16 samples, W4A16 only
    python benchmarks/compress_quality.py --repeat 3    # min and median seconds of 3 runs
    python benchmarks/compress_quality.py --quick --samples 128 --repeat 3  # W4A16 timing

On a shared CPU, check the load averages printed at the start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _worker
import numpy as np
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


# ---- measurement, inside each fresh process -------------------------------------------------


def measure_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one ``compress`` (and, if asked, evaluate its model); seconds and memory."""
    import torch

    from llmc_trace.algorithms.scheme import W4A16
    from llmc_trace.evaluate import perplexity
    from llmc_trace.oneshot import CompressRequest, Stage, compress

    torch.set_num_threads(THREADS)
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
    """Perplexity of the model with the Linear weights saved by the reference run.

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
    tokens = np.load(model_dir / "eval.npy")
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


@dataclass
class Row:
    """What was measured for one setting."""

    setting: Setting
    baseline: dict[str, Any]
    ours: list[dict[str, Any]]
    theirs: list[dict[str, Any]]


def values(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [run[key] for run in runs if run.get(key) is not None]


def seconds_text(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    if len(seconds) == 1:
        return f"{seconds[0]:.1f}"
    return f"{min(seconds):.1f} / {statistics.median(seconds):.1f}"


def ppl_text(run: dict[str, Any] | None) -> str:
    return f"{run['ppl']:.3f}" if run and "ppl" in run else "failed"


def recovered(rtn: dict[str, Any], compressed: dict[str, Any] | None, fp_ppl: float) -> str:
    if not compressed or "ppl" not in compressed or "ppl" not in rtn:
        return "-"
    return f"{(rtn['ppl'] - compressed['ppl']) / (rtn['ppl'] - fp_ppl):.1%}"


def mib_text(sizes_bytes: list[float]) -> str:
    return f"{statistics.median(sizes_bytes) / MiB:.0f}" if sizes_bytes else "-"


def ratio_text(ours: list[float], theirs: list[float]) -> str:
    if not ours or not theirs:
        return "-"
    return f"{statistics.median(ours) / statistics.median(theirs):.2f}x"


def print_results(rows: list[Row], fp_ppl: float, repeat: int) -> None:
    timing = "seconds" if repeat == 1 else f"seconds (min / median of {repeat})"
    print()
    print(f"| setting | baseline ppl | ours ppl | fp ppl | ours {timing} |")
    print("|---|---|---|---|---|")
    for row in rows:
        name = row.setting.baseline + (", then rtn" if row.setting.then_quantize else "")
        baseline = f"{ppl_text(row.baseline)} ({name})"
        ours = row.ours[0] if row.ours else None
        seconds = seconds_text(values(row.ours, "compress_s"))
        print(f"| {row.setting.label} | {baseline} | {ppl_text(ours)} | {fp_ppl:.3f} | {seconds} |")
    w4 = rows[0]
    if w4.setting.bits == 4 and w4.ours:
        print(
            f"\nW4A16: GPTQ recovers {recovered(w4.baseline, w4.ours[0], fp_ppl)} of RTN's "
            f"perplexity loss ((ppl_rtn - ppl_gptq) / (ppl_rtn - ppl_fp))"
        )

    compared = [row for row in rows if row.theirs]
    if not compared:
        return
    print("\nSide by side with llm-compressor's GPTQ (same model, same calibration rows):\n")
    print(
        "| setting | ppl ours / theirs | recovered ours / theirs | seconds ours | seconds theirs "
        "| ours/theirs s | MiB ours | MiB theirs | ours/theirs MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in compared:
        ours, theirs = row.ours[0] if row.ours else None, row.theirs[0]
        ours_s, theirs_s = values(row.ours, "compress_s"), values(row.theirs, "oneshot_s")
        ours_bytes = values(row.ours, "compress_rss_bytes")
        theirs_bytes = values(row.theirs, "load_and_oneshot_rss_bytes")
        print(
            f"| {row.setting.label} | {ppl_text(ours)} / {ppl_text(theirs)} "
            f"| {recovered(row.baseline, ours, fp_ppl)} / {recovered(row.baseline, theirs, fp_ppl)} "
            f"| {seconds_text(ours_s)} | {seconds_text(theirs_s)} | {ratio_text(ours_s, theirs_s)} "
            f"| {mib_text(ours_bytes)} | {mib_text(theirs_bytes)} "
            f"| {ratio_text(ours_bytes, theirs_bytes)} |"
        )
    print("\nDetails (medians over runs):")
    for row in (r for r in compared if not r.setting.is_variant):
        label = row.setting.label
        pipeline_s = values(row.ours, "pipeline_s")
        if pipeline_s:
            print(f"  {label}: ours from the first subgraph on {seconds_text(pipeline_s)} s")
        theirs_oneshot_mib = [b / MiB for b in values(row.theirs, "oneshot_rss_bytes")]
        theirs_before_mib = [b / MiB for b in values(row.theirs, "rss_before_oneshot_bytes")]
        if theirs_oneshot_mib:
            print(
                f"  {label}: theirs during oneshot alone +{statistics.median(theirs_oneshot_mib):.0f}"
                f" MiB over {statistics.median(theirs_before_mib):.0f} MiB resident before it"
            )
        for who, runs in (("ours", row.ours), ("theirs", row.theirs)):
            peaks = values(runs, "peak_rss_bytes")
            if peaks:
                print(
                    f"  {label}: {who} whole-process peak {statistics.median(peaks) / MiB:.0f} MiB"
                )
        diffs = values(row.theirs, "max_abs_logit_diff")
        if diffs:
            print(
                f"  {label}: theirs' saved weights reproduce their model's logits to {diffs[0]:.2e}"
            )


def versions() -> str:
    from importlib.metadata import version

    names = ("torch", "transformers", "compressed-tensors")
    return ", ".join(f"{name} {version(name)}" for name in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--samples", type=int, help="calibration rows (default 128; 16 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="W4A16 only, 16 samples by default")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per method (default 1)")
    parser.add_argument(
        "--seed", type=int, default=0, help="which calibration rows are drawn (default 0)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="TEXT", help="rows whose label contains any of these"
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
    samples = args.samples or (16 if args.quick else 128)
    settings = SETTINGS[:1] if args.quick else SETTINGS
    if args.only:
        settings = tuple(s for s in settings if any(text in s.label for text in args.only))
        if not settings:
            parser.error(f"no row's label contains {' or '.join(args.only)}")
    reference = REFERENCE_PYTHON.exists()
    model_dir = args.model_dir.resolve()

    print(f"refmodel {model_dir}; {samples} x {SEQ_LEN} calibration tokens (seed {args.seed})")
    print(f"{versions()}; {THREADS} torch threads per run; {args.repeat} timed run(s) per method")
    if not reference:
        print(
            f"no {REFERENCE_PYTHON}: llm-compressor is skipped (bash benchmarks/reference_env.sh)"
        )
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    start = time.perf_counter()
    fp = run_worker("fp", {"model_dir": str(model_dir)}, "fp")
    fp_ppl = fp.get("ppl", float("nan"))
    print(f"  fp perplexity {fp_ppl:.3f}", flush=True)

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="compress_quality_") as folder:
        calib_rows = Path(folder) / "calib_rows.npy"
        if reference:
            save_calibration_rows(model_dir, samples, args.seed, calib_rows)
        for setting in settings:
            baseline = run_ours(
                model_dir, setting.baseline, setting, samples, args.seed, evaluate=True
            )
            ours: list[dict[str, Any]] = []
            theirs: list[dict[str, Any]] = []
            for index in range(args.repeat):
                ours.append(
                    run_ours(model_dir, setting.method, setting, samples, args.seed, index == 0)
                )
                if reference and setting.has_reference:
                    save = Path(folder) / f"theirs_{setting.bits}bit.pt" if index == 0 else None
                    theirs.append(run_theirs(model_dir, setting, calib_rows, save))
            if setting.is_variant:  # the same llm-compressor runs as its plain row
                theirs = next(
                    (
                        r.theirs
                        for r in rows
                        if (r.setting.bits, r.setting.group_size)
                        == (setting.bits, setting.group_size)
                        and r.theirs
                    ),
                    [],
                )
            rows.append(Row(setting, baseline, ours, theirs))

    print_results(rows, fp_ppl, args.repeat)
    print(
        f"\nload average (1 min) at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
        f"{time.perf_counter() - start:.0f} s in all"
    )


if __name__ == "__main__":
    main()
