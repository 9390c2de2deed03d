"""``SubgraphSummary``: one subgraph as reports and pictures show it, with its byte counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from llmc_trace.core.sizes import parameter_bytes, value_bytes
from llmc_trace.graph.partition import PartitionedTrace


@dataclass(frozen=True)
class SubgraphSummary:
    """One subgraph; byte counts are those of the traced model (the full size, on ``meta``)."""

    index: int
    targets: list[str]
    num_nodes: int
    input_names: list[str]
    output_names: list[str]
    consumed_names: list[str]
    output_bytes: int
    parameter_bytes: int

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def summarize(model: torch.nn.Module, partitioned: PartitionedTrace) -> list[SubgraphSummary]:
    values = {node.name: node.meta.get("val") for node in partitioned.trace.graph.nodes}
    return [
        SubgraphSummary(
            index=subgraph.index,
            targets=subgraph.targets,
            num_nodes=subgraph.num_nodes,
            input_names=subgraph.input_names,
            output_names=subgraph.output_names,
            consumed_names=subgraph.consumed_names,
            output_bytes=sum(value_bytes(values.get(n)) for n in subgraph.output_names),
            parameter_bytes=parameter_bytes(subgraph.submodules(model)),
        )
        for subgraph in partitioned.subgraphs
    ]
