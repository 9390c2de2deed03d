"""The small interface where pipelines meet compressors.

Pipelines know nothing of GPTQ; compressors know nothing of tracing. A pipeline tells its
callbacks which modules are about to run (``on_subgraph_start``: register hooks, they will see
every calibration sample), which batch comes next (``on_batch``: only the pipeline holds the
batch, and a hook sees a layer's input without the attention mask that says which of its rows
are padding), that calibration of those modules is complete (``on_calibrated``: compress now;
with error propagation the pipeline then recomputes the outputs), and that it moved on
(``on_subgraph_end``: remove hooks, free state). It asks two questions first: whether the
callbacks want a group of modules at all (``wants``: else it runs them once, or not at all
after the last wanted one), and in how many passes over the batches to calibrate them
(``passes``: running the batches is the pipeline's job, so a compressor that bounds the state
alive at once can only ask for more passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

NamedModules = Sequence[tuple[str, torch.nn.Module]]


class Callbacks(Protocol):
    """What a pipeline calls."""

    def wants(self, modules: NamedModules) -> bool:
        """Whether any of ``modules`` needs calibration data (else the pipeline runs them once)."""
        ...

    def passes(self, modules: NamedModules) -> list[NamedModules]:
        """How the calibration of ``modules`` splits into passes over the batches, each
        announced on its own (``[modules]`` for one; a compressor bounding how many experts'
        Hessians are alive at once asks for several)."""
        ...

    def on_subgraph_start(self, index: int, modules: NamedModules) -> None: ...

    def on_batch(self, batch: dict[str, torch.Tensor]) -> None:
        """The model inputs of the batch about to run (compressors read its attention mask)."""
        ...

    def on_calibrated(self, index: int, modules: NamedModules) -> None: ...

    def on_subgraph_end(self, index: int, modules: NamedModules) -> None: ...


def named_submodules(
    model: torch.nn.Module, modules: Sequence[torch.nn.Module]
) -> list[tuple[str, torch.nn.Module]]:
    """Pair modules with their paths in ``model``, in module order."""
    wanted = {id(m) for m in modules}
    return [(name, module) for name, module in model.named_modules() if id(module) in wanted]


def modules_outside(
    model: torch.nn.Module, targets: Sequence[torch.nn.Module]
) -> list[torch.nn.Module]:
    """Every module of ``model`` that is neither one of ``targets`` nor inside one (the
    embeddings, final norm and head of a decoder stack, and the containers holding them)."""
    inside = {id(m) for target in targets for m in target.modules()}
    return [m for m in model.modules() if id(m) not in inside]
