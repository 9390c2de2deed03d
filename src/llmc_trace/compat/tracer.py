"""llm-compressor's ``SequentialTracer``: llmc-trace's tracer with llm-compressor's leaf rule.

The rule: a module is traced into only when it is a call-graph ancestor of a sequential target
(:func:`~llmc_trace.compat.get_sequential_ancestors`) and its weights are not offloaded; the
targets, the modules beside them (embeddings, norms, rotary tables, a vision tower holding no
target) and offloaded modules are each one ``call_module`` node. Everything else is
llmc-trace's tracer: example values on every node, mask builders recorded as one call, objects
a forward builds rebuilt from graph values.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from llmc_trace.tracing.opaque import default_opaque_functions
from llmc_trace.tracing.targets import LEAF_IGNORED, LEAF_NO_TARGET
from llmc_trace.tracing.trace import concrete_arguments, split_sample
from llmc_trace.tracing.tracer import LlmcTracer


class SequentialTracer(LlmcTracer):
    """Trace a model without tracing inside sequential targets, inside modules that are not
    call-graph ancestors of a target, or inside ``offloaded`` modules (whose weights are not
    where the trace could read them)::

        targets = match_modules(model, ["LlamaDecoderLayer"])
        tracer = SequentialTracer(get_sequential_ancestors(model, targets))
        graph = fx.GraphModule(model, tracer.trace(model, dummy_inputs=sample))
        torch.testing.assert_close(graph(**sample)["logits"], model(**sample).logits)

    Override :meth:`is_leaf_module` to change the rule, as with any torch.fx tracer.
    """

    def __init__(
        self,
        ancestors: Collection[torch.nn.Module],
        offloaded: Collection[torch.nn.Module] = frozenset(),
    ) -> None:
        self.ancestors = set(ancestors)
        self.offloaded = set(offloaded)
        self._entered = False
        super().__init__(self._leaf_reason, default_opaque_functions())

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return m not in self.ancestors or m in self.offloaded

    def _leaf_reason(self, path: str, module: torch.nn.Module) -> str | None:
        if not self.is_leaf_module(module, path):
            return None
        return LEAF_IGNORED if module in self.offloaded else LEAF_NO_TARGET

    def trace(
        self,
        root: torch.nn.Module | Any,
        concrete_args: dict[str, Any] | None = None,
        dummy_inputs: dict[str, Any] | None = None,
        complete_concrete_args_with_inputs_not_in_dummy_inputs: bool = True,
    ) -> fx.Graph:
        """Trace ``root(**dummy_inputs, **concrete_args)``: the tensors of ``dummy_inputs``
        become placeholders and values flow through the trace, so control flow on their
        shapes is decided by them; everything else is a constant of the graph.

        ``complete_concrete_args_with_inputs_not_in_dummy_inputs`` is accepted for
        llm-compressor's callers: parameters missing from both keep their defaults either way
        (``use_cache`` is off), as :func:`~llmc_trace.compat.populate_concrete_args` gives them.
        """
        if self._entered:  # the tracer's own call, from trace_model below
            return super().trace(root, concrete_args)
        tensors, constants = split_sample(dict(dummy_inputs or {}))
        concrete = {
            **concrete_arguments(root, tensors),
            **constants,
            **{k: v for k, v in (concrete_args or {}).items() if k not in tensors},
        }
        self._entered = True
        try:
            with torch.no_grad():
                return self.trace_model(root, tensors, concrete)
        finally:
            self._entered = False
