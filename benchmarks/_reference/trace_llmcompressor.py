"""Time llm-compressor's ``trace_subgraphs`` once on a full-size model built on ``meta``.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/trace_speed.py`` in a fresh process per measurement. It imports nothing from
llmc-trace: the model is built from the config folder the way a user would build it (the class
named by ``architectures[0]``, eager attention, caches off, in the given dtype), the sample is
the very batch llmc-trace traced (saved with ``torch.save``), and the ignore list is
llm-compressor's default (``DatasetArguments().tracing_ignore``).

The trace runs twice: ``first_s`` pays one-time costs (first use of meta kernels), ``second_s``
does not. Prints one line ``RESULT {json}`` with those, ``num_subgraphs``, ``peak_rss_bytes``
(the process's ``ru_maxrss``), ``trace_rss_bytes`` (the peak during the first call above
the resident set just before it) and ``environment`` (``benchmarks/_environment.py``), or
``error`` when llm-compressor cannot trace the model.

    python trace_llmcompressor.py CONFIG_DIR SAMPLE.pt --targets LlamaDecoderLayer --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_rss.py, _worker.py, ...
from _environment import describe  # noqa: E402
from _rss import peak_rss_since_reset, reset_peak_rss  # noqa: E402
from _worker import failure_text  # noqa: E402


def build_meta_model(config_dir: str, dtype_name: str):  # type: ignore[no-untyped-def]
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    for sub in [config, *[v for v in vars(config).values() if hasattr(v, "to_dict")]]:
        if hasattr(sub, "use_cache"):
            sub.use_cache = False
    model_class = next(
        (getattr(transformers, a) for a in config.architectures or [] if hasattr(transformers, a)),
        AutoModelForCausalLM,
    )
    with torch.device("meta"):
        model = model_class._from_config(
            config, attn_implementation="eager", dtype=getattr(torch, dtype_name)
        )
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir")
    parser.add_argument("sample", help="a dict of tensors saved with torch.save")
    parser.add_argument("--targets", nargs="+", required=True, help="sequential target classes")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from llmcompressor.args.dataset_arguments import DatasetArguments
    from llmcompressor.pipelines.sequential.helpers import trace_subgraphs

    result: dict[str, object] = {"environment": describe(["llmcompressor", "compressed-tensors"])}
    try:
        model = build_meta_model(args.config_dir, args.dtype)
        sample = torch.load(args.sample)
        ignore = DatasetArguments().tracing_ignore
        try:
            before, exact = reset_peak_rss(), True
        except OSError:  # the high-water mark cannot be reset here: no RSS figure
            before, exact = 0, False
        for key in ("first_s", "second_s"):
            start = time.perf_counter()
            subgraphs = trace_subgraphs(model, sample, list(args.targets), ignore)
            result[key] = time.perf_counter() - start
            result["num_subgraphs"] = len(subgraphs)
            if exact and key == "first_s":
                result["trace_rss_bytes"] = peak_rss_since_reset() - before
    except Exception as err:  # a model llm-compressor cannot trace is a result, not a crash
        result["error"] = failure_text(err)
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
