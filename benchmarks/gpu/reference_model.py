"""The reference model compressed on the CPU and on the run's device: perplexities side by side.

Both runs take the same checkpoint (``refmodel/``, bf16), the same calibration rows and GPTQ
W4A16; on the CPU the forward passes run in float32, on a GPU in bf16
(:func:`~llmc_trace.pipelines.residency.compute_dtype`), so the Hessians differ by the
activations' rounding and a few roundings of the solve may flip. The float model and both
checkpoints are then scored on the same evaluation rows on the run's device, so a difference
comes from compression alone. Beside the perplexities: the share of the 4-bit integers the two
checkpoints agree on (unpacked from compressed-tensors' int32 words), and for the run on a GPU
its device peak per phase (:mod:`phases`) against the memory plan's estimate,
``plan_peak_ratio`` the whole run's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from phases import PhaseMeter, phase_peaks_against_plan
from llmc_trace import CompressRequest, compress
from llmc_trace.evaluate import load_for_evaluation, perplexity

#: (calibration rows, evaluation rows, tokens per row): the README's quality setting, and a
#: few short rows for the dry run
FULL_ROWS, SMALL_ROWS = (128, 128, 512), (2, 2, 64)
NIBBLES = torch.arange(0, 32, 4, dtype=torch.int32)  # 8 four-bit fields per int32 word


def packed_integers(folder: Path) -> dict[str, torch.Tensor]:
    """Every ``weight_packed`` tensor of a W4A16 checkpoint, unpacked to its 4-bit fields."""
    fields = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in handle.keys():
                if name.endswith("weight_packed"):
                    words = handle.get_tensor(name)  # (out, in / 8) int32
                    fields[name] = (words[..., None] >> NIBBLES) & 0xF
    return fields


def agreement(a: Path, b: Path) -> float:
    """The share of 4-bit integers equal in checkpoints ``a`` and ``b``."""
    first, second = packed_integers(a), packed_integers(b)
    equal = sum(int((first[n] == second[n]).sum()) for n in first)
    return equal / sum(t.numel() for t in first.values())


def score(folder: Path, rows: np.ndarray, device: torch.device) -> dict[str, float]:
    """Perplexity of the checkpoint in ``folder`` on ``rows``, computed on ``device``."""
    model = load_for_evaluation(folder).to(device)
    result = perplexity(model, rows, batch_size=8)
    return {"perplexity": result.perplexity, "eval_s": result.elapsed_s}


def run(spec: dict[str, Any], save: Any) -> dict[str, Any]:
    device = torch.device(spec["device"])
    folder = Path(spec["refmodel"])
    calibration_rows, evaluation_rows, seq_len = SMALL_ROWS if spec["small"] else FULL_ROWS
    rows = np.load(folder / "eval.npy")[:evaluation_rows, :seq_len]
    figures: dict[str, Any] = {
        "samples": calibration_rows,
        "seq_len": seq_len,
        "eval_rows": evaluation_rows,
        "eval_device": str(device),
        "float": score(folder, rows, device),
    }
    save(figures)
    outputs = {}
    for key, where in (("compressed_on_cpu", "cpu"), ("compressed_on_device", str(device))):
        out = Path(spec["work"]) / "refmodel" / key
        request = CompressRequest(
            str(folder),
            dataset=str(folder / "calib.npy"),
            out_dir=str(out),
            scheme="W4A16",
            samples=calibration_rows,
            seq_len=seq_len,
            overwrite=True,
        )
        start = time.perf_counter()
        meter = PhaseMeter(lambda phases: None, torch.device(where))
        with meter.instrumented():
            result = compress(request, device=torch.device(where), progress=meter)
        figures[key] = {
            "compress_device": where,
            "compress_s": time.perf_counter() - start,
            **score(out, rows, device),
        }
        if meter.peaks:  # a GPU run: its peaks against the plan
            estimate = result.plan.estimate(result.pipeline)
            peak = max(meter.peaks.values())
            figures.update(
                device_peak_bytes=peak,
                plan_device_bytes=estimate.device_bytes,
                plan_peak_ratio=peak / estimate.device_bytes,
                phases_against_plan=phase_peaks_against_plan(meter.peaks, estimate.device_phases),
            )
        outputs[key] = out
        save(figures)
    figures["int_weights_equal_fraction"] = agreement(*outputs.values())
    cpu, on_device = (figures[k]["perplexity"] for k in outputs)
    figures["perplexity_gap"] = on_device / cpu - 1
    return figures
