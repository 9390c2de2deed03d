"""Dtypes and devices a trace recorded as literals, moved to where calibration computes.

The tracer answers ``x.dtype`` from the example value and records the answer as a literal
(``image_embeds.to(device, inputs_embeds.dtype)`` becomes ``.to(..., torch.bfloat16)``): the
graph is the model's code for parameters of the dtype it was traced with. On a CPU the
pipelines compute in float32 whatever the checkpoint stores (bf16 products are several times
slower there), so a literal of the stored dtype would cast activations back to it: a
``masked_scatter`` of bf16 image features into float32 embeddings fails outright, a bf16
rotary table silently rounds. Moving those literals to the compute dtype gives the graph the
model's own code would have traced with its parameters in that dtype, which is the model the
residency runs.

Devices are recorded the same way when the model's code asks a module rather than a tensor
(``embeddings.to(self.device)``, Idefics3): a streamed run traces the skeleton on ``meta``,
and a ``meta`` literal in a graph that runs on real tensors is always wrong, so it becomes the
calibration device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from llmc_trace.graph.subgraph import Subgraph

Recorded = torch.dtype | torch.device
META = torch.device("meta")


def retarget_literals(subgraphs: Sequence[Subgraph], old: Recorded, new: Recorded) -> int:
    """Replace every ``old`` dtype or device literal in the subgraphs' nodes with ``new``, in
    place (each changed subgraph compiles again when next run); the number of nodes changed."""
    if old == new:
        return 0
    changed = 0
    for subgraph in subgraphs:
        found = [node for node in subgraph.graph.nodes if _holds((node.args, node.kwargs), old)]
        for node in found:
            node.args, node.kwargs = _swap(node.args, old, new), _swap(node.kwargs, old, new)
        if found:
            subgraph.recompile()
        changed += len(found)
    return changed


def _holds(value: Any, literal: Recorded) -> bool:
    """Whether ``literal`` stands anywhere in ``value`` (nested arguments)."""
    if isinstance(value, type(literal)):
        return value == literal
    if isinstance(value, (tuple, list)):
        return any(_holds(item, literal) for item in value)
    if isinstance(value, dict):
        return any(_holds(item, literal) for item in value.values())
    return False


def _swap(value: Any, old: Recorded, new: Recorded) -> Any:
    if isinstance(value, type(old)):
        return new if value == old else value
    if isinstance(value, tuple):
        return tuple(_swap(item, old, new) for item in value)
    if isinstance(value, list):
        return [_swap(item, old, new) for item in value]
    if isinstance(value, dict):
        return {key: _swap(item, old, new) for key, item in value.items()}
    return value
