"""Compress a checkpoint folder with llm-compressor 0.14 as its users do, and measure it.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/compress_scale.py`` in a fresh process; it imports nothing from llmc-trace. The
model loads with ``dtype="auto"`` (the checkpoint's own), ``oneshot`` runs GPTQ W4A16 on every
Linear but ``lm_head`` over the given token rows, and ``save_pretrained(save_compressed=True)``
writes the compressed-tensors checkpoint: the same work ``llmc-trace compress`` does.

Seconds cover loading, ``oneshot`` and saving; memory is the resident high-water mark (VmHWM)
over the whole process, and the resident set right after the imports is reported beside it, so
the caller subtracts the same baseline it subtracts from llmc-trace.

    python compress_scale_llmcompressor.py MODEL_DIR CALIB_ROWS.npy OUT_DIR --tokenizer DIR

``oneshot`` insists on a processor even for token ids; the random models have no tokenizer, so
``--tokenizer`` names a folder holding one (its vocabulary is never used: the rows are ids).

Prints one line ``RESULT {json}``, or with ``error`` when it fails; ``environment`` and the load
averages before and after say what the run ran with (``benchmarks/_environment.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_rss.py, ...
from _environment import describe, load_average  # noqa: E402
from _rss import peak_rss_since_reset, resident_bytes  # noqa: E402
from _worker import failure_text  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("calib_rows", help=".npy token ids, one calibration sample per row")
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="a folder with any tokenizer")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()

    import numpy as np
    import torch
    import transformers  # noqa: F401  (part of the baseline, as for llmc-trace)
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict[str, object] = {"baseline_rss_bytes": resident_bytes()}
    result["environment"] = describe(["llmcompressor", "compressed-tensors"])
    result["load_before"] = load_average()
    try:
        rows = np.load(args.calib_rows).astype(np.int64)
        dataset = Dataset.from_dict(
            {"input_ids": rows.tolist(), "attention_mask": np.ones_like(rows).tolist()}
        )
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype="auto", attn_implementation="sdpa"
        )
        model = oneshot(
            model=model,
            dataset=dataset,
            recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]),
            processor=AutoTokenizer.from_pretrained(args.tokenizer),
            num_calibration_samples=rows.shape[0],
            max_seq_length=rows.shape[1],
            shuffle_calibration_samples=False,
        )
        model.save_pretrained(args.out_dir, save_compressed=True)
        result["seconds"] = time.perf_counter() - start
        result["peak_rss_bytes"] = peak_rss_since_reset()
        result["load_after"] = load_average()
    except Exception as err:  # a failed reference run is a result to report, not a crash
        result["error"] = failure_text(err)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
