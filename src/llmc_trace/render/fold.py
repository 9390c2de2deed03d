"""Fold runs of identical layers and modules so that a deep model's picture stays readable.

An 80-layer model has 80 interchangeable decoder layers; drawn one by one they make a picture
tens of thousands of points tall that says nothing the first one does not. Folding draws a run
of identical layers once, labelled with what it stands for (``model.layers.1–78 ×78``); the
HTML page unfolds it on demand, and the SVG views draw every member when asked to expand.

A *layer* is a numbered module (``model.layers.3``) with the consecutive subgraphs that hold
its targets: one subgraph with the default targets, seven with ``Linear`` targets. Two layers
are identical when a reader could not tell them apart: the same operations (layer numbers
erased), the same classes and tracing roles in the modules they call (a dense layer is not an
MoE layer, though both are one call), and the same parameter bytes. Numbered sibling modules
(``experts.0`` to ``experts.255``) are identical when their subtrees have the same classes,
relative paths and roles; named siblings such as ``q_proj`` and ``k_proj`` are never merged,
as they mean different things even when alike.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import torch

from llmc_trace.graph.structure import subgraph_signature
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.render.roles import subtree_signature
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.targets import LeafPlan

#: A view folds when one of its runs of identical members is longer than this: a deep model.
FOLD_ABOVE = 8
_NUMBERED_PART = re.compile(r"^(.*?\.\d+)(?:\.|$)")
_LAST_NUMBER = re.compile(r"^(.*\D)(\d+)$")
#: ``3`` or ``expert_3``: a numbered sibling; ``norm1`` and ``fc2`` name different things.
_NUMBERED_NAME = re.compile(r"^((?:.*_)?)\d+$")

#: ``(path, module)`` of each member of a run of sibling modules.
ModuleRun = list[tuple[str, torch.nn.Module]]


@dataclass(frozen=True)
class Layer:
    """Consecutive subgraphs whose first targets lie in one numbered module.

    ``path`` is that module (``model.layers.3``), or the first target when no part of its
    path is numbered; ``None`` for a subgraph without targets (the head).
    """

    path: str | None
    subgraphs: tuple[Subgraph, ...]


def layer_path(target: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.3``: the outermost numbered module.

    >>> layer_path("model.layers.3.mlp.up_proj"), layer_path("lm_head")
    ('model.layers.3', 'lm_head')
    """
    match = _NUMBERED_PART.match(target)
    return match.group(1) if match else target


def layers_of(subgraphs: Sequence[Subgraph]) -> list[Layer]:
    """``subgraphs`` in order, grouped into layers (a subgraph without targets stands alone)."""
    layers: list[Layer] = []
    for subgraph in subgraphs:
        path = layer_path(subgraph.targets[0]) if subgraph.targets else None
        if layers and path is not None and layers[-1].path == path:
            layers[-1] = Layer(path, (*layers[-1].subgraphs, subgraph))
        else:
            layers.append(Layer(path, (subgraph,)))
    return layers


def layer_signature(trace: TracedModel, layer: Layer) -> tuple[object, ...]:
    """What must agree for two layers to be drawn as one; see the module docstring."""
    parameters = {s.index: s.parameter_bytes for s in trace.summaries}
    parts: list[object] = []
    for subgraph in layer.subgraphs:
        parts += [subgraph_signature(subgraph), parameters[subgraph.index]]
        for path in subgraph.module_paths():
            module = trace.model.get_submodule(path)
            parts.append(subtree_signature(module, trace.leaves, path))
    return tuple(parts)


def identical_runs(trace: TracedModel, subgraphs: Sequence[Subgraph]) -> list[list[Layer]]:
    """The layers of ``subgraphs``, consecutive identical ones grouped into runs."""
    runs: list[list[Layer]] = []
    previous: tuple[object, ...] | None = None
    for layer in layers_of(subgraphs):
        signature = layer_signature(trace, layer) if layer.path is not None else None
        if runs and signature is not None and signature == previous:
            runs[-1].append(layer)
        else:
            runs.append([layer])
        previous = signature
    return runs


def fold_layers(
    trace: TracedModel, subgraphs: Sequence[Subgraph], expand: bool = False
) -> list[list[Layer]]:
    """Runs of identical layers when the model is deep and ``expand`` is not set, else one
    run per layer: what a view draws as one box (or one cluster)."""
    runs = identical_runs(trace, subgraphs)
    if expand or not is_deep(len(run) for run in runs):
        return [[layer] for run in runs for layer in run]
    return runs


def is_deep(run_lengths: Iterable[int]) -> bool:
    """True when some run is longer than :data:`FOLD_ABOVE`: the model is deep."""
    return any(length > FOLD_ABOVE for length in run_lengths)


def path_range(first: str, last: str) -> str:
    """``model.layers.1`` and ``model.layers.78`` -> ``model.layers.1–78``.

    >>> path_range("model.layers.1", "model.layers.78"), path_range("a.0", "a.0")
    ('model.layers.1–78', 'a.0')
    >>> path_range("vision.blocks.31", "model.layers.0")
    'vision.blocks.31 … model.layers.0'
    """
    if first == last:
        return first
    head, tail = _LAST_NUMBER.match(first), _LAST_NUMBER.match(last)
    if head and tail and head.group(1) == tail.group(1):
        return f"{first}–{tail.group(2)}"
    return f"{first} … {last}"


def sibling_runs(
    module: torch.nn.Module, path: str, plan: LeafPlan, marked: Collection[str] = ()
) -> list[ModuleRun]:
    """The children of ``module`` in module order, identical numbered siblings grouped.

    Only numbered children (``layers.0``, ``expert_3``) with one prefix are merged (not
    ``norm1`` and ``norm2``); modules in ``marked`` (the failure's stack) never are.

    >>> import torch
    >>> from llmc_trace.tracing.targets import LeafPlan
    >>> block = torch.nn.Module()
    >>> block.norm1, block.norm2 = torch.nn.LayerNorm(4), torch.nn.LayerNorm(4)
    >>> block.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
    >>> plan = LeafPlan(targets=(), ignored=(), ancestors=frozenset())
    >>> [[p for p, _ in run] for run in sibling_runs(block.experts, "experts", plan)]
    [['experts.0', 'experts.1', 'experts.2']]
    >>> [[p for p, _ in run] for run in sibling_runs(block, "", plan)]
    [['norm1'], ['norm2'], ['experts']]
    """
    runs: list[ModuleRun] = []
    previous: tuple[str, tuple[str, ...]] | None = None
    for name, child in module.named_children():
        child_path = f"{path}.{name}" if path else name
        numbered = _NUMBERED_NAME.match(name)
        key = None
        if numbered is not None:
            key = (numbered.group(1), subtree_signature(child, plan, child_path, marked))
        if key is not None and key == previous:
            runs[-1].append((child_path, child))
        else:
            runs.append([(child_path, child)])
        previous = key
    return runs


def longest_sibling_run(
    module: torch.nn.Module, path: str, plan: LeafPlan, marked: Collection[str] = ()
) -> int:
    """The most identical numbered siblings anywhere under ``module``: how deep the tree is."""
    longest = 1
    for run in sibling_runs(module, path, plan, marked):
        first_path, first = run[0]  # the members are identical: one speaks for all
        longest = max(longest, len(run), longest_sibling_run(first, first_path, plan, marked))
    return longest
