"""The sequential pipeline: calibrate subgraph by subgraph over the verified partition.

For each subgraph: onload its modules, run every batch once with the callbacks listening
(calibration), let the callbacks compress, and, when a weight changed and error propagation is
on, run the batches again so the next subgraph sees the *compressed* outputs. A subgraph that
no callback wants (the head) runs once, with nobody listening; a subgraph whose weights did
not change keeps the outputs of its calibration pass. Nothing runs that cannot change anything.

Memory: only one subgraph's modules sit on the device at a time; intermediates wait on the
offload device (see :class:`~llmc_trace.pipelines.cache.IntermediatesCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.graph.subgraph import MODEL_OUTPUT, Subgraph
from llmc_trace.pipelines.cache import IntermediatesCache, move
from llmc_trace.pipelines.callbacks import Callbacks, named_submodules

#: ``progress(description, done, total)``
Progress = Callable[[str, int, int], None]


@dataclass
class PipelineStats:
    """What a pipeline run did: passes per subgraph and the cache's peak size."""

    passes: list[int] = field(default_factory=list)
    peak_cache_bytes: int = 0
    shared_names: list[str] = field(default_factory=list)


def _onload(modules: Sequence[torch.nn.Module], device: torch.device) -> None:
    for module in modules:
        module.to(device)


def run_sequential(
    model: torch.nn.Module,
    subgraphs: list[Subgraph],
    batches: list[dict[str, Any]],
    callbacks: Callbacks,
    *,
    device: torch.device | None = None,
    offload_device: torch.device | None = None,
    propagate_error: bool = True,
    progress: Progress | None = None,
) -> PipelineStats:
    """Run ``subgraphs`` over ``batches`` (see the module docstring); returns statistics."""
    device = device or torch.device("cpu")
    offload = offload_device or torch.device("cpu")
    report = progress or (lambda description, done, total: None)
    inputs = [{k: v for k, v in b.items() if k in _graph_inputs(subgraphs)} for b in batches]
    cache = IntermediatesCache.from_batches(inputs, offload)
    stats = PipelineStats()
    on_device = device != offload
    for position, subgraph in enumerate(subgraphs):
        label = f"subgraph {position + 1}/{len(subgraphs)}"
        if subgraph.targets:
            label += f" · {subgraph.targets[0]}"
        modules = subgraph.submodules(model)
        named = named_submodules(model, modules)
        if on_device:
            _onload(modules, device)
        listening = callbacks.wants(named)
        passes = 1
        if listening:
            callbacks.on_subgraph_start(subgraph.index, named)
        outputs = _run_all(
            model, subgraph, cache, device, label, report, batches if listening else None, callbacks
        )
        if listening:
            changed = callbacks.on_calibrated(subgraph.index, named)
            callbacks.on_subgraph_end(subgraph.index, named)
            is_last = position == len(subgraphs) - 1
            if changed and propagate_error and not is_last:
                outputs.clear()  # the uncompressed outputs are stale: free them first
                outputs = _run_all(model, subgraph, cache, device, label + " · propagate", report)
                passes = 2
        for index, values in enumerate(outputs):
            values.pop(MODEL_OUTPUT, None)
            cache.update(index, values)
        cache.delete(subgraph.consumed_names)
        stats.peak_cache_bytes = max(stats.peak_cache_bytes, cache.size_bytes())
        stats.passes.append(passes)
        if on_device:
            _onload(modules, offload)
    stats.shared_names = sorted(cache.shared_names)
    return stats


def _graph_inputs(subgraphs: list[Subgraph]) -> set[str]:
    produced = {name for s in subgraphs for name in s.output_names}
    return {name for s in subgraphs for name in s.input_names if name not in produced}


def _run_all(
    model: torch.nn.Module,
    subgraph: Subgraph,
    cache: IntermediatesCache,
    device: torch.device,
    label: str,
    report: Progress,
    batches: list[dict[str, Any]] | None = None,
    callbacks: Callbacks | None = None,
) -> list[dict[str, Any]]:
    """Run ``subgraph`` on every cached batch; with ``callbacks``, announce each batch first."""
    outputs = []
    private = subgraph.mutated_inputs()
    with torch.no_grad():
        for index in range(len(cache)):
            report(label, index, len(cache))
            if callbacks is not None and batches is not None:
                callbacks.on_batch(batches[index])
            values = cache.fetch(index, subgraph.input_names, device, private)
            result = subgraph.forward(model, **values)
            result.pop(MODEL_OUTPUT, None)  # logits of every batch would dwarf the cache
            outputs.append({k: move(v, cache.offload_device) for k, v in result.items()})
    report(label, len(cache), len(cache))
    return outputs
