"""GPTQ calibrated on images against GPTQ calibrated on captions alone, and against round-to-nearest,
on the repository's trained vision-language model.

``refmodel/vlm/`` (``refmodel.VLM_FOLDER``) is a small LLaVA trained here to caption drawn
images (``refmodel/train_vlm.py``). Each setting compresses its language model in memory (the
vision tower and projector stay in full precision, as compress's default ignore list keeps
them) in three ways, and scores the perplexity of ``eval/``'s 128 captions given their images:

* RTN: round-to-nearest, no data;
* GPTQ, images: calibrated on ``calib/``'s 128 captioned images, each row laid out by the
  folder's chat template and preprocessed by its processor (``modality="image"``);
* GPTQ, captions: calibrated on the same 128 captions as text alone (``modality="text"``):
  packed with eos into windows of ``TEXT_SEQ_LEN`` tokens, as many as they fill, so every
  caption token is seen and no image embedding is.

The float row is ``evaluate_multimodal`` on the uncompressed checkpoint (bf16 weights computed
in float32, as every row is). ``--repeat N`` calibrates each GPTQ row at the first N batch
sizes of 1, 2, 4 and 8: that changes no calibration value, only the order of float sums, so the
range it gives (the "spread") is the noise floor a difference between two rows must clear
(the README's convention for ``compress_quality.py``). RTN uses no data and has no spread.

The run writes ``benchmarks/results/vlm_quality.json`` (``_results.Run``): every perplexity
with the batch size it was calibrated at, the float model's, and the settings; ``tables``
renders the table printed here, and the README's, from that file alone.

    python benchmarks/vlm_quality.py               # W4A16, 3-bit and 2-bit, batch size 1
    python benchmarks/vlm_quality.py --repeat 3    # each GPTQ row at batch sizes 1, 2 and 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import AutoTokenizer

from llmc_trace import CompressRequest, compress
from llmc_trace.algorithms.scheme import W4A16
from llmc_trace.data.multimodal import MultimodalCalibrationSet, load_multimodal_calibration
from llmc_trace.evaluate import perplexity
from llmc_trace.evaluate.run import evaluate_multimodal
from refmodel import VLM_FOLDER

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import Run  # noqa: E402

#: The matrices are tiny: a second thread adds synchronisation, not speed (on the shared
#: 2-core machine two made a training step ten times slower, as ``train_vlm.py`` notes).
THREADS = 1
BATCH_SIZES = (1, 2, 4, 8)
#: Tokens per packed text sample: about a captioned image row's text and placeholders.
TEXT_SEQ_LEN = 64
#: Tokens per image row, at most (a row is about 50: its placeholders, layout and caption).
IMAGE_SEQ_LEN = 256
EVAL_BATCH_SIZE = 8

SCHEMES = {
    "W4A16 (4-bit g128)": W4A16,
    "3-bit g128": W4A16.with_weights(num_bits=3),
    "2-bit g128": W4A16.with_weights(num_bits=2),
}


class Calibration(NamedTuple):
    """One way to calibrate: the method, the data's modality, and the rows' shape. (A named
    tuple: ``tables.py`` imports this script without registering it as a module, which a
    dataclass's string annotations need.)"""

    label: str
    method: str
    modality: str
    samples: int
    seq_len: int


def caption_tokens(folder: Path, calib: Path) -> int:
    """The calibration captions' tokens when packed as the text loader packs them: each
    caption's tokens (no special tokens added) and an eos. They fill ``// TEXT_SEQ_LEN``
    windows."""
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    texts = [json.loads(line)["text"] for line in calib.read_text().splitlines()]
    return sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 for text in texts)


def compressed_perplexity(
    folder: Path,
    calib: Path,
    scheme,
    calibration: Calibration,
    batch_size: int,
    eval_set: MultimodalCalibrationSet,
) -> tuple[float, float]:
    """Perplexity on ``eval_set`` after compressing in memory, and the seconds ``compress`` took."""
    start = time.perf_counter()
    result = compress(
        CompressRequest(
            folder,
            dataset=calib,
            method=calibration.method,
            scheme=scheme,
            modality=calibration.modality,
            samples=calibration.samples,
            seq_len=calibration.seq_len,
            batch_size=batch_size,
        )
    )
    seconds = time.perf_counter() - start
    ppl = perplexity(result.model.float(), eval_set).perplexity
    return ppl, seconds


def spread_text(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.5f}"
    return f"{values[0]:.5f} ({min(values):.5f}-{max(values):.5f})"


def spread(values: list[float]) -> float:
    """The range of one row's perplexities over batch sizes (0 for a single run)."""
    return max(values) - min(values)


def margin_text(margin: float, noise: float) -> str:
    """A margin and, when there is a spread to compare it with, how many spreads it is."""
    return f"{margin:+.5f}" + (f" ({margin / noise:.0f}x)" if noise else "")


def recovered(rtn: float, gptq: float, float_ppl: float) -> str:
    """The share of RTN's perplexity loss GPTQ wins back, as the README's results table gives
    it: ``(ppl_rtn - ppl_gptq) / (ppl_rtn - ppl_fp)``."""
    return f"{(rtn - gptq) / (rtn - float_ppl):.0%}"


def tables(result: dict[str, Any]) -> dict[str, str]:
    """The markdown table, from the result file alone: each GPTQ row at the first batch size
    with its range over the run's batch sizes, and each margin at that batch size in units of
    the spread it must clear: GPTQ on images against RTN (which has none) that of the images
    row, images against captions the larger of the two rows' spreads."""
    figures = result["figures"]
    float_ppl = figures["float_perplexity"]
    lines = [
        "| setting | float | RTN | GPTQ, images | GPTQ, captions | recovered, images / captions "
        "| images vs RTN | images vs captions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in figures["schemes"]:
        rtn, images, captions = (
            [run["perplexity"] for run in row["runs"][label]]
            for label in ("RTN", "GPTQ, images", "GPTQ, captions")
        )
        shared = max(spread(images), spread(captions))
        lines.append(
            f"| {row['setting']} | {float_ppl:.5f} | {rtn[0]:.5f} | {spread_text(images)} "
            f"| {spread_text(captions)} | {recovered(rtn[0], images[0], float_ppl)} / "
            f"{recovered(rtn[0], captions[0], float_ppl)} "
            f"| {margin_text(rtn[0] - images[0], spread(images))} "
            f"| {margin_text(captions[0] - images[0], shared)} |"
        )
    return {"quality": "\n".join(lines)}


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: the harshest setting, GPTQ on images against captions alone."""
    figures = result["figures"]
    row = figures["schemes"][-1]
    first = {label: row["runs"][label][0]["perplexity"] for label in row["runs"]}
    return [(
        f"VLM {row['setting']}: GPTQ calibrated on images vs on its captions alone",
        f"perplexity {first['GPTQ, images']:.5f} vs {first['GPTQ, captions']:.5f} "
        f"(float {figures['float_perplexity']:.5f}, RTN {first['RTN']:.5f})",
    )]


def shown(folder: Path) -> str:
    """``folder`` from the repository's root where it lies inside it."""
    folder, root = folder.resolve(), HERE.parent
    return folder.relative_to(root).as_posix() if folder.is_relative_to(root) else str(folder)


def legend(batch_sizes: list[int]) -> str:
    """What the table's cells are, for the console and the result's notes."""
    sizes = ", ".join(map(str, batch_sizes))
    return (
        f"Perplexity of eval/'s 128 captions given their images. GPTQ rows at batch size "
        f"{batch_sizes[0]}"
        + (f", their range over batch sizes {sizes} in brackets" if len(batch_sizes) > 1 else "")
        + "; recovered: (RTN - GPTQ) / (RTN - float); the margins are positive where GPTQ on "
        "images is better"
        + (
            ", in brackets in units of the spread each must clear (the images row's against "
            "RTN, the larger of the two GPTQ rows' against each other)"
            if len(batch_sizes) > 1
            else ""
        )
        + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help=f"calibrate each GPTQ row at the first N batch sizes of {BATCH_SIZES} (default 1)",
    )
    parser.add_argument("--schemes", nargs="*", choices=list(SCHEMES), default=list(SCHEMES))
    parser.add_argument("--model-dir", type=Path, default=VLM_FOLDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.repeat <= len(BATCH_SIZES):
        parser.error(f"--repeat must be 1 to {len(BATCH_SIZES)}")
    torch.set_num_threads(THREADS)
    run = Run("vlm_quality")
    folder = args.model_dir
    calib, held_out = folder / "calib" / "captions.jsonl", folder / "eval" / "captions.jsonl"
    tokens = caption_tokens(folder, calib)
    windows = tokens // TEXT_SEQ_LEN
    calibrations = (
        Calibration("RTN", "rtn", "image", 128, IMAGE_SEQ_LEN),
        Calibration("GPTQ, images", "gptq", "image", 128, IMAGE_SEQ_LEN),
        Calibration("GPTQ, captions", "gptq", "text", windows, TEXT_SEQ_LEN),
    )
    batch_sizes = list(BATCH_SIZES[: args.repeat])
    started = time.perf_counter()
    print(f"refmodel/vlm: calibrated on {calib.parent.name}/ (128 images, or their captions")
    print(f"packed into {windows} windows of {TEXT_SEQ_LEN} tokens), scored on the 128 rows of")
    print(f"{held_out.parent.name}/; GPTQ at batch sizes {', '.join(map(str, batch_sizes))}")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    eval_set = load_multimodal_calibration(
        held_out, folder, samples=128, seq_len=IMAGE_SEQ_LEN, batch_size=EVAL_BATCH_SIZE,
        shuffle=False,
    )  # fmt: skip
    float_ppl = evaluate_multimodal(folder, held_out, samples=128, dtype=torch.float32).perplexity
    print(f"float (bf16 weights): {float_ppl:.5f}", flush=True)

    rows = []
    for label in args.schemes:
        scheme = SCHEMES[label]
        measured: dict[str, list[dict[str, float]]] = {}
        for calibration in calibrations:
            sizes = batch_sizes if calibration.method == "gptq" else batch_sizes[:1]
            for batch_size in sizes:
                ppl, seconds = compressed_perplexity(
                    folder, calib, scheme, calibration, batch_size, eval_set
                )
                measured.setdefault(calibration.label, []).append(
                    {"batch_size": batch_size, "perplexity": ppl}
                )
                print(
                    f"  {label:20} {calibration.label:15} batch {batch_size}: ppl {ppl:.5f} "
                    f"({seconds:.0f} s)",
                    flush=True,
                )
        rows.append({"setting": label, "runs": measured})

    figures = {
        "model": shown(folder),
        "threads": THREADS,
        "batch_sizes": batch_sizes,
        "calibration_rows": 128,
        "eval_rows": 128,
        "eval_batch_size": EVAL_BATCH_SIZE,
        "image_seq_len": IMAGE_SEQ_LEN,
        "text_seq_len": TEXT_SEQ_LEN,
        "caption_tokens": tokens,
        "caption_windows": windows,
        "float_perplexity": float_ppl,
        "schemes": rows,
    }
    document = {"figures": figures}
    print()
    print(tables(document)["quality"])
    print()
    print(legend(batch_sizes))
    run.write(figures, notes=[legend(batch_sizes)])
    print(
        f"load average (1 min) at end: {os.getloadavg()[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s in all"
    )

if __name__ == "__main__":
    main()
