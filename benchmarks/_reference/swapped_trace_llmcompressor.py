"""llm-compressor 0.14's GPTQ ``oneshot`` as shipped, or with llmc-trace's ``trace_subgraphs`` in it.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/swapped_trace.py`` in a fresh process per run. ``oneshot`` gets the model folder
itself, so it loads the model as its users' scripts do (its ``dtype="auto"`` and transformers'
default attention kernel, both recorded), the token rows as a ``datasets.Dataset`` (unshuffled,
batch 1), ``GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])``, the
sequential pipeline with ``sequential_targets=["LlamaDecoderLayer"]`` and its default
``tracing_ignore``, and ``output_dir``: it writes its compressed-tensors checkpoint there.

With ``--swap``, the one name the sequential pipeline calls to trace,
``llmcompressor.pipelines.sequential.pipeline.trace_subgraphs`` (imported into that module from
``helpers``, looked up when the pipeline runs), is replaced by ``llmc_trace.trace_subgraphs``:
only this run imports llmc-trace, from the ``PYTHONPATH`` its parent sets. Everything else,
the data, the hooks, the cache, GPTQ and the writer, stays llm-compressor's. Either way the
called function is wrapped to count its calls and record what it was given and returned, so
the result says which tracer ran; llmc-trace's warnings are collected too (its
``trace_subgraphs`` drops, with one warning, the default ``tracing_ignore`` names a Llama lacks).

With ``--hessians FILE``, the Hessians GPTQ receives for the first decoder layer's Linears
(llm-compressor's sum over samples divided by their count, float32) are saved with
``torch.save``: where two runs' integers differ there, these say whether their inputs did.

Prints one line ``RESULT {json}``, or with ``error`` when the run fails.

    python swapped_trace_llmcompressor.py MODEL_DIR ROWS.npy OUT_DIR [--swap] --threads 2
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_environment.py, ...
from _environment import describe, load_average  # noqa: E402
from _rss import peak_rss_since_reset  # noqa: E402
from _worker import failure_text  # noqa: E402

#: the module whose global ``trace_subgraphs`` ``SequentialPipeline.__call__`` calls
PIPELINE_MODULE = "llmcompressor.pipelines.sequential.pipeline"
FIRST_LAYER = "model.layers.0."


class Collected(logging.Handler):
    """Keeps the text of every record it is given."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def counted(trace: Any, calls: list[dict[str, Any]]) -> Any:
    """``trace``, recording each call's targets, ignore list, seconds and subgraphs."""

    def wrapper(model: Any, sample_input: Any, sequential_targets: Any, ignore: Any, *rest: Any):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        subgraphs = trace(model, sample_input, sequential_targets, ignore, *rest)
        calls.append(
            {
                "function": f"{trace.__module__}.{trace.__qualname__}",
                "sequential_targets": [str(t) for t in sequential_targets],
                "ignore": list(ignore),
                "seconds": time.perf_counter() - start,
                "subgraphs": len(subgraphs),
                "subgraph_class": f"{type(subgraphs[0]).__module__}.{type(subgraphs[0]).__name__}",
            }
        )
        return subgraphs

    return wrapper


def timed_solves(seconds: list[float]) -> None:
    """Make each of GPTQ's ``quantize_weight`` calls add its seconds to ``seconds``: the
    solves, which vary most between identical runs on a busy machine, apart from the rest."""
    from llmcompressor.modifiers.gptq import base

    solve = base.quantize_weight

    def quantize_weight(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return solve(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    base.quantize_weight = quantize_weight


def keep_first_layer_hessians(into: dict[str, Any]) -> None:
    """Make GPTQ save, before it quantizes them, the first decoder layer's Hessians in ``into``
    (normalized by sample count as ``prepare_batch`` hands them to ``quantize_weight``)."""
    from llmcompressor.modifiers.gptq import GPTQModifier

    original = GPTQModifier.compress_module_list

    def compress_module_list(self: Any, module_list: list[Any]) -> Any:
        for module in module_list:
            name = self._module_names[module]
            if name.startswith(FIRST_LAYER):
                into[name] = (self._hessians[module] / self._num_samples[module]).float().clone()
        return original(self, module_list)

    GPTQModifier.compress_module_list = compress_module_list


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("rows", help=".npy token ids (samples, seq_len), calibrated in order")
    parser.add_argument("out_dir")
    parser.add_argument("--swap", action="store_true", help="trace with llmc_trace's function")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--hessians", help="torch.save the first layer's Hessians here")
    args = parser.parse_args()

    import numpy as np
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier

    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"environment": describe(["llmcompressor", "compressed-tensors"])}
    result["load_before"] = load_average()
    try:
        pipeline = importlib.import_module(PIPELINE_MODULE)
        trace = pipeline.trace_subgraphs
        warnings = Collected()
        if args.swap:
            import llmc_trace

            trace = llmc_trace.trace_subgraphs
            result["llmc_trace_file"] = llmc_trace.__file__
            logging.getLogger("llmc_trace").addHandler(warnings)
        calls: list[dict[str, Any]] = []
        pipeline.trace_subgraphs = counted(trace, calls)
        solves: list[float] = []
        timed_solves(solves)
        hessians: dict[str, Any] = {}
        if args.hessians:
            keep_first_layer_hessians(hessians)

        rows = np.load(args.rows).astype(np.int64)
        dataset = Dataset.from_dict(
            {"input_ids": rows.tolist(), "attention_mask": np.ones_like(rows).tolist()}
        )
        start = time.perf_counter()
        model = oneshot(
            model=args.model_dir,
            dataset=dataset,
            recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]),
            pipeline="sequential",
            sequential_targets=["LlamaDecoderLayer"],
            num_calibration_samples=rows.shape[0],
            max_seq_length=rows.shape[1],
            batch_size=1,
            shuffle_calibration_samples=False,
            output_dir=args.out_dir,
        )
        result["seconds"] = time.perf_counter() - start
        result["solves_s"] = sum(solves)
        result["dtype"] = str(model.dtype).removeprefix("torch.")
        result["attn_implementation"] = model.config._attn_implementation
        result["trace_calls"] = calls
        result["llmc_trace_warnings"] = warnings.messages
        result["peak_rss_bytes"] = peak_rss_since_reset()
        if args.hessians:
            torch.save(hessians, args.hessians)
        result["load_after"] = load_average()
    except Exception as err:  # a failed reference run is a result to report, not a crash
        result["error"] = failure_text(err)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
