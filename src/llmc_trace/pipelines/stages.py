"""Split a subgraph's compressible layers into stages by data dependence (true-sequential).

Calibrating a whole decoder layer in one pass gives ``o_proj`` and the MLP the inputs the
*uncompressed* q/k/v produced, although after compression they will see what the compressed
ones produce. Calibrating stage by stage, with each stage's Hessians collected after the stages
it reads from were compressed, lets every layer correct the error of the layers before it in
the same decoder layer, as error propagation already does across decoder layers. A stage is
every layer at the same dependency depth: q/k/v (they read the layer's input), then ``o_proj``,
then gate/up (and, in a mixture of experts, every routed expert's at once), then down.

Depth comes from one dry-run batch with autograd on: a layer's input is traced back through its
``grad_fn`` graph to the outputs of the layers that produced it. Layers the dry run did not
reach (experts no token of that batch was routed to) join the last stage, which runs the whole
subgraph.

A stage's pass need not finish the forward: once every layer of the stage has seen the batch,
:class:`StageComplete` ends it (the pass keeps no outputs), so the q/k/v pass costs a layer
norm and the ``o_proj`` pass stops before the MLP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from llmc_trace.pipelines.callbacks import NamedModules


class StageComplete(Exception):
    """Every layer of the current stage has seen this batch: the rest of the forward is moot."""


def dependency_stages(
    run_once: Callable[[], Any], layers: NamedModules
) -> list[list[tuple[str, torch.nn.Module]]]:
    """``layers`` grouped by dependency depth, shallowest first (see the module docstring).

    ``run_once`` runs the subgraph on one batch. Falls back to one stage holding every layer
    when the dry run cannot run with autograd on.
    """
    by_module = {id(module): name for name, module in layers}
    produced_by: dict[Any, str] = {}  # grad_fn of a layer's output -> the layer
    depth: dict[str, int] = {}

    def before(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        name = by_module[id(module)]
        if name in depth or not args or not isinstance(args[0], torch.Tensor):
            return
        sources = _producing_layers(args[0].grad_fn, produced_by)
        depth[name] = 1 + max((depth[s] for s in sources), default=-1)

    def after(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            produced_by[output.grad_fn] = by_module[id(module)]

    handles = [m.register_forward_pre_hook(before) for _, m in layers]
    handles += [m.register_forward_hook(after) for _, m in layers]
    try:
        with _weights_require_grad(layers), torch.enable_grad():
            run_once()
    except Exception:  # model code that cannot run under autograd: calibrate in one stage
        return [list(layers)]
    finally:
        for handle in handles:
            handle.remove()
    deepest = max(depth.values(), default=0)
    stages: list[list[tuple[str, torch.nn.Module]]] = [[] for _ in range(deepest + 1)]
    for name, module in layers:
        stages[depth.get(name, deepest)].append((name, module))
    return [stage for stage in stages if stage]


def _producing_layers(grad_fn: Any, produced_by: dict[Any, str]) -> set[str]:
    """Layers whose outputs ``grad_fn``'s graph reaches without passing another layer.

    ``seen`` holds the nodes themselves, not their ids: autograd makes a node's Python object
    when ``next_functions`` is read and frees it when the last reference goes, so an id kept
    alone can be taken by another node's object later in the walk, which would then read as
    seen and cut its branch (``o_proj`` staged with the ``q/k/v_proj`` it reads)."""
    found: set[str] = set()
    seen: set[Any] = set()
    stack = [grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in produced_by:
            found.add(produced_by[node])
            continue
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return found


@contextlib.contextmanager
def _weights_require_grad(layers: NamedModules) -> Iterator[None]:
    """Outputs of the layers need a ``grad_fn`` even when the model was frozen."""
    frozen = [p for _, m in layers for p in m.parameters(recurse=False) if not p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(True)
    try:
        yield
    finally:
        for parameter in frozen:
            parameter.requires_grad_(False)


class StopWhenSeen:
    """Forward pre-hooks raising :class:`StageComplete` once each layer saw the batch.

    Registered after the compressor's hooks, so they run after them. :meth:`next_batch`
    starts the count again.
    """

    def __init__(self, layers: Sequence[tuple[str, torch.nn.Module]]) -> None:
        self._waiting = {id(module) for _, module in layers}
        self._seen: set[int] = set()
        self._handles = [m.register_forward_pre_hook(self._saw) for _, m in layers]

    def _saw(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self._seen.add(id(module))
        if self._seen >= self._waiting:
            raise StageComplete

    def next_batch(self) -> None:
        self._seen.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
