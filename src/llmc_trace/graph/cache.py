"""Subgraphs per input signature, re-traced when a batch breaks a guard of the cached trace.

A trace answers shape questions from its sample (see :mod:`~llmc_trace.tracing.guards`). A
batch with another signature (say a longer sequence) may still fit the same graph; the guards
say whether it does. If it does not, running the old graph would silently take the wrong
branch, so the batch is traced anew and that trace cached under its own signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.graph.partition import PartitionedTrace, partition_trace
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.tracing.guards import GuardViolation, check_guards, input_signature
from llmc_trace.tracing.trace import split_sample, trace_graph


@dataclass
class SubgraphCache:
    """Traces of one model, keyed by input signature; ``subgraphs_for(batch)`` picks or traces."""

    model: torch.nn.Module
    sequential_targets: list[str] | None = None
    ignore: list[str] | None = None
    targets_per_subgraph: int = 1
    entries: dict[tuple[Any, ...], PartitionedTrace] = field(default_factory=dict)
    retraces: list[tuple[tuple[Any, ...], list[GuardViolation]]] = field(default_factory=list)

    def subgraphs_for(self, batch: dict[str, Any]) -> list[Subgraph]:
        return self.entry_for(batch).subgraphs

    def entry_for(self, batch: dict[str, Any]) -> PartitionedTrace:
        signature = input_signature(batch)
        if signature in self.entries:
            return self.entries[signature]
        tensors, _ = split_sample(batch)
        broken: list[GuardViolation] = []
        unique = {id(entry): entry for entry in self.entries.values()}
        for entry in unique.values():
            if set(entry.trace.input_names) != set(tensors):
                continue
            violations = check_guards(entry.trace.graph, self.model, entry.trace.guards, tensors)
            if not violations:
                self.entries[signature] = entry
                return entry
            broken.extend(violations)
        if broken:
            self.retraces.append((signature, broken))
        trace = trace_graph(self.model, batch, self.sequential_targets, self.ignore)
        entry = partition_trace(trace, self.targets_per_subgraph)
        self.entries[signature] = entry
        return entry
