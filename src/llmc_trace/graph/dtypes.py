"""Dtypes a trace recorded as literals, moved to the dtype calibration computes in.

The tracer answers ``x.dtype`` from the example value and records the answer as a literal
(``image_embeds.to(device, inputs_embeds.dtype)`` becomes ``.to(..., torch.bfloat16)``): the
graph is the model's code for parameters of the dtype it was traced with. On a CPU the
pipelines compute in float32 whatever the checkpoint stores (bf16 products are several times
slower there), so a literal of the stored dtype would cast activations back to it: a
``masked_scatter`` of bf16 image features into float32 embeddings fails outright, a bf16
rotary table silently rounds. Moving those literals to the compute dtype gives the graph the
model's own code would have traced with its parameters in that dtype, which is the model the
residency runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from llmc_trace.graph.subgraph import Subgraph


def retarget_dtype_literals(
    subgraphs: Sequence[Subgraph], old: torch.dtype, new: torch.dtype
) -> int:
    """Replace every ``old`` dtype literal in the subgraphs' nodes with ``new``, in place
    (each changed subgraph compiles again when next run); the number of nodes changed."""
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


def _holds(value: Any, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` stands anywhere in ``value`` (nested arguments)."""
    if isinstance(value, torch.dtype):
        return value == dtype
    if isinstance(value, (tuple, list)):
        return any(_holds(item, dtype) for item in value)
    if isinstance(value, dict):
        return any(_holds(item, dtype) for item in value.values())
    return False


def _swap(value: Any, old: torch.dtype, new: torch.dtype) -> Any:
    if isinstance(value, torch.dtype):
        return new if value == old else value
    if isinstance(value, tuple):
        return tuple(_swap(item, old, new) for item in value)
    if isinstance(value, list):
        return [_swap(item, old, new) for item in value]
    if isinstance(value, dict):
        return {key: _swap(item, old, new) for key, item in value.items()}
    return value
