"""Find the cross-subgraph values that are the same for every sample, by running the twin.

The sequential cache stores such values once (it compares each with the first batch's). The
plan must know which they are, and the graph alone cannot tell: a rotary embedding reads the
hidden states, but only for their dtype. So we ask the tiny twin: run its subgraphs on two
samples of the same shape with different content and keep the names whose values agree.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.graph.partition import partition_trace
from llmc_trace.graph.subgraph import MODEL_OUTPUT
from llmc_trace.models.build import build_twin
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import ModelSource
from llmc_trace.pipelines.cache import IntermediatesCache
from llmc_trace.tracing.trace import trace_graph


def sample_invariant_names(
    source: ModelSource,
    options: SampleOptions,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
) -> set[str]:
    """Names of intermediates equal across two samples (unpadded text of the same shape)."""
    twin = build_twin(source)
    samples = [
        make_sample(
            twin.config, "text", SampleOptions(options.seq_len, None, options.batch_size, seed)
        )
        for seed in (1, 2)
    ]
    partitioned = partition_trace(trace_graph(twin, samples[0], sequential_targets, ignore))
    inputs = [{k: v for k, v in s.items() if k in partitioned.trace.input_names} for s in samples]
    cache = IntermediatesCache.from_batches(inputs, torch.device("cpu"))
    with torch.no_grad():
        for subgraph in partitioned.subgraphs:
            for index in range(len(cache)):
                values = cache.fetch(
                    index, subgraph.input_names, torch.device("cpu"), subgraph.mutated_inputs()
                )
                results: dict[str, Any] = subgraph.forward(twin, **values)
                results.pop(MODEL_OUTPUT, None)
                cache.update(index, results)
    return set(cache.shared_names)
