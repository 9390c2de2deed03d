"""Run llm-compressor's AWQ (W4A16) or SmoothQuant + GPTQ (W8A8) ``oneshot`` once and time it.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/smoothing_quality.py`` in a fresh process per measurement. It imports nothing from
llmc-trace: the model is loaded as a user loads it (float32, sdpa), the calibration rows are the
very token rows llmc-trace calibrated on, unshuffled, and the recipe is llm-compressor's own:
``AWQModifier()`` (its registry's mappings for the model's architecture, ``n_grid`` 20, duo
scaling) followed by ``QuantizationModifier(targets="Linear", scheme="W4A16",
ignore=["lm_head"])``, as its AWQ examples compose them, or
``SmoothQuantModifier(smoothing_strength=0.5)`` followed by
``GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])``.

llm-compressor 0.14's AWQ pins its cached activations in page-locked memory before each
pair's grid search (``modifiers/transform/awq/base.py``), which raises on a machine without an
accelerator; pinning only speeds copies to one, so on such a machine the cache's
``pin_memory`` is replaced by a no-op for the run (:func:`cpu_stand_in`), its one change to
the tool. Only ``oneshot`` is timed; memory is the resident high-water mark over the run (VmHWM reset
just before ``oneshot``, over the resident set then). With ``--save``, the model's whole state
(the scales are folded into norms as well as Linear weights; each quantized weight beside its
``weight_scale``, since the model rounds it in its forward) is saved with ``torch.save``, with
the logits of ``--check-row`` computed here, so the caller can confirm it reproduces them.
With ``--save-checkpoint``, the model is then saved compressed as its users save it
(``save_pretrained(..., save_compressed=True)``), for the caller to compare its integers.

Prints one line ``RESULT {json}``, or with ``error`` when oneshot fails.

    python smoothing_llmcompressor.py MODEL_DIR ROWS.npy --method awq --threads 2 --save OUT.pt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _rss, _worker, _environment
from _environment import describe  # noqa: E402
from _rss import peak_rss_since_reset, reset_peak_rss  # noqa: E402
from _worker import failure_text  # noqa: E402


def build_recipe(method: str) -> list:  # type: ignore[type-arg]
    """llm-compressor's modifiers for ``awq`` or ``smoothquant+gptq``, with its defaults."""
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform import AWQModifier, SmoothQuantModifier

    if method == "awq":
        return [
            AWQModifier(),
            QuantizationModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]),
        ]
    return [
        SmoothQuantModifier(smoothing_strength=0.5),
        GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]),
    ]


def cpu_stand_in() -> bool:
    """Without CUDA, make ``IntermediatesCache.pin_memory`` a no-op (see the module
    docstring); whether it did."""
    import torch

    if torch.cuda.is_available():
        return False
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("calib_rows", help=".npy token ids, one calibration sample per row")
    parser.add_argument("--method", choices=("awq", "smoothquant+gptq"), required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--save", help="torch.save the compressed model's state here")
    parser.add_argument("--check-row", help=".npy of one token row whose logits to save too")
    parser.add_argument("--save-checkpoint", help="save the compressed checkpoint here")
    args = parser.parse_args()

    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    result: dict[str, object] = {"environment": describe(["llmcompressor", "compressed-tensors"])}
    try:
        result["pinning_stood_in"] = cpu_stand_in()
        rows = np.load(args.calib_rows).astype(np.int64)  # (samples, seq_len)
        dataset = Dataset.from_dict(
            {"input_ids": rows.tolist(), "attention_mask": np.ones_like(rows).tolist()}
        )
        model = AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        before = reset_peak_rss()
        start = time.perf_counter()
        model = oneshot(
            model=model,
            dataset=dataset,
            recipe=build_recipe(args.method),
            num_calibration_samples=rows.shape[0],
            max_seq_length=rows.shape[1],
            shuffle_calibration_samples=False,
        )
        result["oneshot_s"] = time.perf_counter() - start
        result["oneshot_rss_bytes"] = peak_rss_since_reset() - before
        if args.save:
            # the weights as the model holds them (smoothed, not yet rounded: its forward
            # rounds them) and each one's quantization scales and zero points
            state = {name: t.detach().clone() for name, t in model.state_dict().items()}
            check: dict[str, torch.Tensor] = {}
            if args.check_row:
                row = torch.as_tensor(np.load(args.check_row), dtype=torch.long)[None]  # (1, T)
                with torch.no_grad():
                    check = {"input_ids": row, "logits": model(input_ids=row).logits.float()}
            torch.save({"state": state, "check": check}, args.save)
        if args.save_checkpoint:  # last: compressing for the save changes the model in place
            model.save_pretrained(args.save_checkpoint, save_compressed=True)
    except Exception as err:  # a failed reference run is a result to report, not a crash
        result["error"] = failure_text(err)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
