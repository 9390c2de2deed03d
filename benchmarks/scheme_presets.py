"""Every compressed-tensors preset through ``compress``: written, reloaded by transformers, served by vLLM.

For each preset of the installed compressed-tensors (``llmc_trace.algorithms.scheme.
PRESET_NAMES``), the reference model (``refmodel/``) is quantized by round-to-nearest and
written by the checkpoint writer, as ``llmc-trace compress --method rtn --scheme PRESET``
writes it (in this process: the command's tracing and calibration pass, which round-to-nearest
does not use, would only cost time). A row says:

* ``written``: the checkpoint's format (its config's ``format``), or the one sentence
  ``compress`` refuses the preset with (the check of the stage it builds: exit status 2,
  before any weight loads);
* ``reloaded``: transformers (its compressed-tensors quantizer, ``dequantize=True``) loads the
  checkpoint, and every quantized layer's weight equals, bit for bit, the one the quantization
  left; otherwise how many layers differ;
* ``llmc-trace`` and ``vLLM``: the perplexity of the first ``--rows`` evaluation rows, by
  ``llmc-trace evaluate``'s evaluator (transformers, activations quantized as the preset says)
  and by vLLM's CPU build (``benchmarks/vllm_serving.py``'s worker and verdicts: ``agrees``
  within ``--tolerance``; ``no kernel here; reference agrees`` where vLLM's CPU build lacks
  the weight-only integer kernel and a plain matmul stands in for it; ``REFUSED`` with vLLM's
  own words where it cannot run the checkpoint at all, found in the one start that fails;
  ``DISAGREES`` beyond the tolerance, except ``vLLM's FP8 arithmetic agrees``: an FP8 checkpoint
  with per-token FP8 activations, scored again in our evaluator's model with vLLM's CPU
  arithmetic for its linear layers (``_reference/vllm_fp8_arithmetic.py``) and with its
  weights alone, where the first lands within the tolerance of vLLM's score and nearer to it
  than the second: both numbers are recorded).

Each preset costs one vLLM start (two where the reference kernel stands in), about 30 s on an
idle machine, the rest a few seconds. ``--extend`` keeps the result file's rows and runs the
presets ``--presets`` names (by default those not yet tried on vLLM), its command recorded
beside the earlier ones.

Round-to-nearest keeps the run data-free where it can (GPTQ's checkpoints have the same format;
``benchmarks/scheme_quality.py`` measures their quality). The figures are written to
``benchmarks/results/scheme_presets.json`` (``--result`` names another file);
``tables(result)`` renders the docs' table.

    bash benchmarks/vllm_env.sh
    flock /tmp/llmc-bench.lock python benchmarks/scheme_presets.py          # every preset
    python benchmarks/scheme_presets.py --presets FP8_DYNAMIC NVFP4A16      # some
    python benchmarks/scheme_presets.py --serve FP8_DYNAMIC W4A8    # every preset written, two served
    python benchmarks/scheme_presets.py --extend      # the presets the result file has not served
    python benchmarks/scheme_presets.py --extend --presets W3A16     # W3A16 again, the rest kept
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import Run, goal  # noqa: E402
from _reference.vllm_fp8_arithmetic import fp8_per_token  # noqa: E402
from vllm_serving import (  # noqa: E402
    REFMODEL,
    VENV_PYTHON,
    Case,
    Row,
    Subject,
    cell,
    judge,
    our_perplexity,
    text_subject,
    worker_environment,
)


#: The verdict of a written preset ``--serve`` leaves out.
NOT_SERVED = "not served in this run"


def refusal(preset: str) -> str | None:
    """The sentence ``compress`` refuses ``preset`` with (exit status 2, before any weight
    loads), or None: the stage a ``--method rtn --scheme PRESET`` run builds, checked."""
    from llmc_trace.errors import BadInputError
    from llmc_trace.oneshot import Stage

    try:
        Stage("rtn", preset)
    except BadInputError as err:
        return str(err)  # the message and its hint, as the command prints them
    return None


def write_checkpoint(preset: str, out: Path) -> dict[str, Any]:
    """Round-to-nearest of the reference model written by the checkpoint writer, as
    ``compress --method rtn`` writes it; each quantized layer's weight."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmc_trace.algorithms import resolve_scheme, rtn
    from llmc_trace.checkpoint.writer import save_compressed

    scheme = resolve_scheme(preset)
    model = AutoModelForCausalLM.from_pretrained(REFMODEL, dtype=torch.bfloat16)
    quantized = {
        name: rtn(module.weight.data, scheme.weights)
        for name, module in model.named_modules()
        if scheme.is_target(name, module)
    }
    save_compressed(model, out, quantized, [scheme], source_dir=REFMODEL)
    return {name: q.weight for name, q in quantized.items()}


def reload_mismatches(folder: Path, weights: dict[str, Any]) -> int:
    """Quantized layers whose weight, as transformers decompresses the checkpoint, is not the
    weight the quantization left."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    reloaded = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=CompressedTensorsConfig(dequantize=True)
    )
    return sum(
        not torch.equal(reloaded.get_submodule(name).weight, weight)
        for name, weight in weights.items()
    )


def run_preset(preset: str, scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One preset's row (see the module docstring)."""
    start = time.perf_counter()
    folder = scratch / preset
    refused = refusal(preset)
    entry: dict[str, Any] = {"preset": preset}
    if refused is not None:
        entry.update(written=False, exit_status=2, refusal=refused)
        return entry
    weights = write_checkpoint(preset, folder)
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    entry.update(written=True, format=config["format"])
    entry["reload_mismatches"] = reload_mismatches(folder, weights)
    if args.serve is not None and preset not in args.serve:
        entry.update(llmc_trace=None, vllm=None, gap=None, verdict=NOT_SERVED)
        entry.update(detail="", wall_s=round(time.perf_counter() - start, 1))
        return entry
    subject = text_subject(args.rows)
    row = Row(Case(preset))
    row.ours = our_perplexity(folder, subject)
    judge(row, folder, subject, args.tolerance, ())
    entry.update(
        llmc_trace=row.ours,
        vllm=row.vllm if row.vllm is not None and math.isfinite(row.vllm) else None,
        gap=row.numbers.get("difference"),
        verdict=row.verdict,
        detail=row.detail,
        load_s=row.numbers.get("load_s"),
    )
    if row.verdict == "DISAGREES" and fp8_per_token(config):
        entry.update(arithmetic(folder, subject, row, args.tolerance))
    entry["wall_s"] = round(time.perf_counter() - start, 1)
    return entry


def arithmetic(folder: Path, subject: Subject, row: Row, tolerance: float) -> dict[str, Any]:
    """Why an FP8-per-token checkpoint's two scores differ: our evaluator's model scored again
    with vLLM's CPU arithmetic for its linear layers, and with its weights alone. The verdict
    names vLLM's arithmetic when that lands within ``tolerance`` of vLLM's score, and nearer
    to it than the weights alone (see ``_reference/vllm_fp8_arithmetic.py``)."""
    from _reference.vllm_fp8_arithmetic import use_vllm_fp8_arithmetic, weights_only

    assert row.vllm is not None and row.ours is not None
    emulated = perplexity_with(folder, subject, partial(use_vllm_fp8_arithmetic, folder=folder))
    alone = perplexity_with(folder, subject, weights_only)
    to_vllm = abs(emulated - row.vllm) / row.vllm
    alone_to_vllm = abs(alone - row.vllm) / row.vllm
    found = {"vllm_arithmetic": emulated, "weights_only": alone}
    if to_vllm > tolerance or to_vllm >= alone_to_vllm:
        return found
    return found | {
        "verdict": "vLLM's FP8 arithmetic agrees",
        "detail": (
            f"vLLM quantizes activations per token as declared, rounding in float32 and "
            f"scaling after an FP8 x FP8 product; that arithmetic in llmc-trace's model scores "
            f"{emulated:.3f}, {100 * to_vllm:.3f} % from vLLM (weights alone {alone:.3f}, "
            f"{100 * alone_to_vllm:.3f} %); transformers' compressed forward, our score, rounds "
            f"the token scales and dequantized activations to bfloat16"
        ),
    }


def perplexity_with(folder: Path, subject: Subject, change: Callable[[Any], int]) -> float:
    """Perplexity of the subject's rows by the checkpoint as our evaluator loads it, after
    ``change`` (which must change at least one layer)."""
    import numpy as np

    from llmc_trace.evaluate.perplexity import perplexity
    from llmc_trace.evaluate.run import load_for_evaluation

    model = load_for_evaluation(folder)
    if change(model) == 0:
        raise RuntimeError(f"{folder}: no quantized layer to change")
    rows = np.load(subject.evaluation)[: subject.rows]
    return perplexity(model, rows).perplexity


def preset_order() -> tuple[str, ...]:
    """compressed-tensors' order of its presets: the table's, whatever order they ran in."""
    from llmc_trace.algorithms import PRESET_NAMES

    return PRESET_NAMES


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``presets``: one row per preset."""
    lines = [
        "| preset | written | reloaded (transformers) | llmc-trace | vLLM CPU | gap "
        "| vLLM's verdict |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    order = {name: index for index, name in enumerate(preset_order())}
    for row in sorted(result["figures"]["rows"], key=lambda row: order.get(row["preset"], 99)):
        if not row["written"]:
            refusal = cell(row["refusal"])
            lines.append(f"| {row['preset']} | refused: {refusal} | - | - | - | - | - |")
            continue
        mismatches = row["reload_mismatches"]
        reloaded = "exact" if mismatches == 0 else f"{mismatches} layers differ"
        vllm = f"{row['vllm']:.3f}" if row["vllm"] is not None else "-"
        gap = f"{100 * row['gap']:.3f} %" if row["gap"] is not None else "-"
        verdict = row["verdict"] + (f": {brief(row['detail'])}" if row["detail"] else "")
        ours = f"{row['llmc_trace']:.3f}" if row["llmc_trace"] is not None else "-"
        lines.append(
            f"| {row['preset']} | {row['format']} | {reloaded} | {ours} "
            f"| {vllm} | {gap} | {cell(verdict)} |"
        )
    earlier = result["figures"].get("earlier_commands")
    if earlier:  # an --extend run: where its other rows come from
        lines += ["", "The other rows: " + "; ".join(f"`{command}`" for command in earlier) + "."]
    return {"presets": "\n".join(lines)}


#: A ``QuantizationArgs(...)`` repr in vLLM's words, its closing parenthesis lost where the
#: reason was cut short.
QUANTIZATION_ARGS = re.compile(r"QuantizationArgs\(([^()]*)(\)?)")
FIELD = re.compile(r"(\w+)=('[^']*'|[^,]*)")


def brief(reason: str) -> str:
    """vLLM's reason as one table line: each ``QuantizationArgs(...)`` it quotes cut to its
    type, bits, strategy, group size and dynamic flag (``int4 group 128``)."""

    def short(match: re.Match[str]) -> str:
        fields = {key: value.strip("'") for key, value in FIELD.findall(match.group(1))}
        parts = [fields.get("type", "") + fields.get("num_bits", ""), fields.get("strategy")]
        parts.append(None if fields.get("group_size") == "None" else fields.get("group_size"))
        parts.append("dynamic" if fields.get("dynamic") == "True" else None)
        text = " ".join(part for part in parts if part)
        return text if match.group(2) else f"{text} ..."

    return " ".join(QUANTIZATION_ARGS.sub(short, reason).split())


def main() -> int:
    from llmc_trace.algorithms import PRESET_NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", help="default: all")
    parser.add_argument("--serve", nargs="+", help="the presets scored and served (default: all)")
    parser.add_argument("--rows", type=int, default=8, help="evaluation rows scored")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, 1e-3 = 0.1 %%")
    parser.add_argument(
        "--result", type=Path, help="default: benchmarks/results/scheme_presets.json"
    )
    parser.add_argument(
        "--extend", action="store_true",
        help="keep the result file's rows; run the presets --presets names, by default those "
        "the file has not tried on vLLM",
    )  # fmt: skip
    args = parser.parse_args()
    if not VENV_PYTHON.exists():
        print(f"{VENV_PYTHON} is missing: run `bash benchmarks/vllm_env.sh` first.")
        return 2
    record = Run("scheme_presets")
    worker = worker_environment()
    rows: list[dict[str, Any]] = []
    kept, earlier = earlier_rows(args) if args.extend else ({}, [])
    args.earlier = earlier
    untried = {p for p in PRESET_NAMES if p not in kept or kept[p].get("verdict") == NOT_SERVED}
    run = set(args.presets or (untried if args.extend else PRESET_NAMES))
    order = PRESET_NAMES if args.extend else args.presets or PRESET_NAMES
    with tempfile.TemporaryDirectory() as scratch:
        for preset in [p for p in order if p in run or p in kept]:
            if preset in run:
                rows.append(run_preset(preset, Path(scratch), args))
            else:
                rows.append(kept[preset])
            print(json.dumps(rows[-1]), flush=True)
            for stale in Path(scratch).iterdir():  # a checkpoint at a time on disk
                shutil.rmtree(stale)
            path = write_result(record, rows, args, worker)  # after each preset: a long run's rows
    print(tables(json.loads(path.read_text()))["presets"])
    return 0


def earlier_rows(args: argparse.Namespace) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``--extend``: the result file's rows by preset, and the commands that made them."""
    path = args.result or HERE / "results" / "scheme_presets.json"
    if not path.exists():
        return {}, []
    result = json.loads(path.read_text())
    if result["figures"]["evaluation_rows"] != args.rows:
        raise SystemExit(f"{path} scored {result['figures']['evaluation_rows']} rows: --rows")
    rows = {row["preset"]: row for row in result["figures"]["rows"]}
    return rows, [*result["figures"].get("earlier_commands", []), result["command"]]


def write_result(
    record: Run, rows: list[dict[str, Any]], args: argparse.Namespace, worker: dict[str, Any]
) -> Path:
    """The result file for the presets run so far, with its goals."""
    written = [row for row in rows if row["written"]]
    exact = sum(row["reload_mismatches"] == 0 for row in written)
    refused = [row for row in rows if not row["written"]]
    goals = [
        goal(
            "written checkpoints reload in transformers to our weights",
            "every one, bit for bit",
            f"{exact} of {len(written)}",
            exact == len(written),
        ),
        goal(
            "refused presets",
            "exit status 2 with one sentence",
            f"{len(refused)} refused",
            all(row["exit_status"] == 2 and row["refusal"] for row in refused),
        ),
    ]
    figures: dict[str, Any] = {"evaluation_rows": args.rows, "rows": rows}
    notes = [
        "RTN checkpoints (data-free); GPTQ writes the same formats.",
        f"Perplexity of the first {args.rows} rows of refmodel/eval.npy, 512 tokens each.",
    ]
    if args.earlier:
        figures["earlier_commands"] = args.earlier
        notes.append(
            "Rows kept from earlier runs (--extend): "
            + "; ".join(f"`{command}`" for command in args.earlier)
            + "."
        )
    return record.write(
        figures,
        goals=goals,
        environments={"vLLM worker": worker},
        notes=notes,
        path=args.result,
    )


if __name__ == "__main__":
    sys.exit(main())
