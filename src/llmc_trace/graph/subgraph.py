"""``Subgraph``: one executable piece of a partitioned trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from llmc_trace.graph.compiled import compile_forward
from llmc_trace.tracing.mutation import is_mutation

#: Key under which the last subgraph returns the model's own output.
MODEL_OUTPUT = "output"


@dataclass
class Subgraph:
    """A piece of the model's graph, run as ``forward(model, **inputs) -> dict[name, value]``.

    ``input_names`` are the values it reads (model inputs or earlier subgraphs' outputs);
    ``output_names`` the values later subgraphs read (the last subgraph returns the model output
    under :data:`MODEL_OUTPUT`); ``consumed_names`` are inputs that no later subgraph needs, so
    the intermediates cache can drop them once this subgraph has run. ``targets`` are the module
    paths of the sequential targets inside it (none for the head).

    Executing the subgraphs in order, feeding each the values named by ``input_names``, is
    equivalent to ``model(**sample)``; :func:`llmc_trace.graph.verify.verify_subgraphs` checks it.
    """

    index: int
    graph: fx.Graph
    input_names: list[str]
    output_names: list[str]
    targets: list[str]
    consumed_names: list[str] = field(default_factory=list)
    _compiled: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    @property
    def num_nodes(self) -> int:
        """Operations in this subgraph (placeholders and the output node excluded)."""
        return sum(1 for node in self.graph.nodes if node.op not in ("placeholder", "output"))

    def forward(self, model: torch.nn.Module, **inputs: Any) -> dict[str, Any]:
        if self._compiled is None:
            self._compiled = compile_forward(self.graph, f"subgraph {self.index}")
        return self._compiled(model, **{name: inputs[name] for name in self.input_names})

    def recompile(self) -> None:
        """Forget the compiled code after the graph changed; the next run compiles it."""
        self._compiled = None

    def submodules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Every module this subgraph calls, itself or inside an opaque call (a vision tower
        an opaque ``get_image_features`` runs), with their descendants, in call order."""
        called = [
            path
            for node in self.graph.nodes
            for path in (
                [node.target] if node.op == "call_module" else node.meta.get("modules_called", [])
            )
        ]
        seen: dict[int, torch.nn.Module] = {}
        for path in called:
            for module in model.get_submodule(path).modules():
                seen.setdefault(id(module), module)
        return list(seen.values())

    def mutated_inputs(self) -> frozenset[str]:
        """Inputs this subgraph writes into in place (a cache must hand it copies)."""
        names = set()
        for node in self.graph.nodes:
            if is_mutation(node) and node.args and isinstance(node.args[0], fx.Node):
                if node.args[0].op == "placeholder":
                    names.add(node.args[0].name)
        return frozenset(names)

    def restricted_to(self, paths: set[str]) -> Subgraph:
        """This subgraph cut down to what the calls of the modules at ``paths`` depend on.

        For a pass whose outputs nobody reads (the last one a compressor listens to, whose
        tail computes the logits): it runs the listened-to modules on the same inputs and
        skips the rest. In-place writes into kept values stay, with what they read.
        """
        calls = [n for n in self.graph.nodes if n.op == "call_module" and n.target in paths]
        keep: set[fx.Node] = set()
        frontier = list(calls)
        while frontier:
            while frontier:
                node = frontier.pop()
                if node not in keep:
                    keep.add(node)
                    frontier.extend(node.all_input_nodes)
            frontier = [
                n
                for n in self.graph.nodes
                if n not in keep
                and is_mutation(n)
                and n.args
                and isinstance(n.args[0], fx.Node)
                and n.args[0] in keep
            ]
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for node in self.graph.nodes:
            if node.op == "placeholder" or node in keep:
                env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output({node.name: env[node] for node in calls})
        return Subgraph(self.index, graph, list(self.input_names), [], list(self.targets))

    def module_paths(self) -> list[str]:
        return [str(node.target) for node in self.graph.nodes if node.op == "call_module"]
