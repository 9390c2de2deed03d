"""Run llm-compressor's GPTQ ``oneshot`` once on a checkpoint folder and time it.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/compress_quality.py`` in a fresh process per measurement, so the peak resident set
is this run's own. It imports nothing from llmc-trace: the model is loaded the way a user would
load it (``AutoModelForCausalLM.from_pretrained``, float32, with the attention kernel that
llmc-trace's ``compress`` runs, sdpa by default), the calibration rows are the very token rows
llmc-trace calibrated on (a ``.npy`` of shape ``(samples, seq_len)``, passed as a
``datasets.Dataset`` of ``input_ids`` and ``attention_mask``, unshuffled), and the recipe is ``GPTQModifier(targets="Linear",
ignore=["lm_head"])`` with the preset ``W4A16`` (or the one ``--scheme`` names) or, for other
widths, the same arguments through ``config_groups``.

Only ``oneshot`` is timed (imports and model loading are not). Memory is the kernel's resident
high-water mark (VmHWM), reset with ``/proc/self/clear_refs`` just before loading and again just
before ``oneshot``, over a baseline taken after ``malloc_trim``; so ``oneshot_rss_bytes`` is
compression's own increase and ``load_and_oneshot_rss_bytes`` spans loading too (the span that
llmc-trace's ``compress`` covers, since it loads the model itself).

With ``--save``, the Linear weights of the compressed model (quantized and dequantized in place
by GPTQ) are saved with ``torch.save`` for evaluation by the caller, together with the logits
of ``--check-row`` (one row of token ids) computed here by llm-compressor's model as it stands,
so the caller can confirm that the saved weights reproduce it.

Prints one line ``RESULT {json}`` (with ``environment``: this process's versions and threads),
or with ``error`` when oneshot fails.

    python gptq_llmcompressor.py MODEL_DIR CALIB_ROWS.npy --bits 4 --group-size 128 --threads 2

``--batch-size`` (default 1, oneshot's default) batches the rows; it changes no value fed to
GPTQ, only the order in which floating-point sums are taken.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # _rss, _worker, _environment
from _environment import describe  # noqa: E402
from _rss import peak_rss_since_reset, reset_peak_rss  # noqa: E402
from _worker import failure_text  # noqa: E402


def build_recipe(  # type: ignore[no-untyped-def]
    bits: int, group_size: int, preset: str | None = None
):
    """GPTQ for every Linear but ``lm_head``: ``preset`` (a compressed-tensors preset's name)
    when given, else preset W4A16, else the same args at ``bits``."""
    from llmcompressor.modifiers.gptq import GPTQModifier

    if preset is not None:
        return GPTQModifier(targets="Linear", scheme=preset, ignore=["lm_head"])
    if bits == 4 and group_size == 128:
        return GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=bits, type="int", symmetric=True, strategy="group", group_size=group_size
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    return GPTQModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("calib_rows", help=".npy token ids, one calibration sample per row")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--scheme", help="a compressed-tensors preset (overrides the two above)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--batch-size", type=int, default=1, help="calibration batch size")
    parser.add_argument(
        "--attn-implementation", default="sdpa", help="as llmc-trace's compress (default)"
    )
    parser.add_argument("--save", help="torch.save the compressed Linear weights here")
    parser.add_argument("--check-row", help=".npy of one token row whose logits to save too")
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
        rows = np.load(args.calib_rows).astype(np.int64)  # (samples, seq_len)
        dataset = Dataset.from_dict(
            {"input_ids": rows.tolist(), "attention_mask": np.ones_like(rows).tolist()}
        )
        recipe = build_recipe(args.bits, args.group_size, args.scheme)

        before_load = reset_peak_rss()
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype=torch.float32, attn_implementation=args.attn_implementation
        )
        result["load_s"] = time.perf_counter() - start
        load_peak = peak_rss_since_reset()

        before = reset_peak_rss()
        start = time.perf_counter()
        model = oneshot(
            model=model,
            dataset=dataset,
            recipe=recipe,
            num_calibration_samples=rows.shape[0],
            max_seq_length=rows.shape[1],
            batch_size=args.batch_size,
            shuffle_calibration_samples=False,
        )
        result["oneshot_s"] = time.perf_counter() - start
        oneshot_peak = peak_rss_since_reset()
        result["rss_before_oneshot_bytes"] = before
        result["oneshot_rss_bytes"] = oneshot_peak - before
        result["load_and_oneshot_rss_bytes"] = max(load_peak, oneshot_peak) - before_load
        result["peak_rss_bytes"] = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, load_peak, oneshot_peak
        )

        if args.save:
            weights = {
                f"{name}.weight": module.weight.detach().clone()
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear)
            }
            check: dict[str, torch.Tensor] = {}
            if args.check_row:
                row = torch.as_tensor(np.load(args.check_row), dtype=torch.long)[None]  # (1, T)
                with torch.no_grad():
                    check = {"input_ids": row, "logits": model(input_ids=row).logits.float()}
            torch.save({"weights": weights, "check": check}, args.save)
    except Exception as err:  # a failed reference run is a result to report, not a crash
        result["error"] = failure_text(err)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
