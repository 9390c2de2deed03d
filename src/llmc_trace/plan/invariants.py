"""Find the cross-subgraph values that are the same for every sample, by running the twin.

The sequential cache stores such values once (it compares each with the first batch's). The
plan must know which they are, and the graph alone cannot tell: a rotary embedding reads the
hidden states, but only for their dtype. So we ask the tiny twin: run its subgraphs on two
samples of its sample's shape with different content and keep the names whose values agree.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.graph.subgraph import MODEL_OUTPUT
from llmc_trace.models.samples import SampleOptions
from llmc_trace.pipelines.cache import IntermediatesCache
from llmc_trace.traced.model import TracedModel
from llmc_trace.traced.probe import sample_for


#: the input that says a sample carries media, by modality
_MEDIA_INPUTS = {"pixel_values_videos": "video", "pixel_values": "image", "input_features": "audio"}


def sample_modality(sample: dict[str, Any]) -> str:
    """What ``sample`` holds besides text, from its inputs (a twin traced on images is run on
    images: its subgraphs take pixel values)."""
    return next((m for name, m in _MEDIA_INPUTS.items() if name in sample), "text")


def sample_invariant_names(twin: TracedModel | None) -> set[str]:
    """Names of ``twin``'s intermediates equal across two samples (unpadded text); none when
    there is no traced twin."""
    if twin is None or twin.partitioned is None:
        return set()
    ids = twin.sample["input_ids"]
    batch, seq = int(ids.shape[0]), int(ids.shape[1])
    modality = sample_modality(twin.sample)
    samples = [
        sample_for(twin.model, modality, SampleOptions(seq, None, batch, seed)) for seed in (1, 2)
    ]
    names = twin.partitioned.trace.input_names
    inputs = [{k: v for k, v in s.items() if k in names} for s in samples]
    cache = IntermediatesCache.from_batches(inputs, torch.device("cpu"))
    with torch.no_grad():
        for subgraph in twin.subgraphs:
            for index in range(len(cache)):
                values = cache.fetch(
                    index, subgraph.input_names, torch.device("cpu"), subgraph.mutated_inputs()
                )
                results: dict[str, Any] = subgraph.forward(twin.model, **values)
                results.pop(MODEL_OUTPUT, None)
                cache.replace(index, subgraph.consumed_names, results)
    return set(cache.shared_names)
