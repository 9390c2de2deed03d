"""A torch.fx ``Proxy`` that carries an example value, so shape questions get concrete answers.

Plain torch.fx refuses ``bool``, ``len``, ``int`` and iteration on a proxy. Model code asks those
questions constantly, almost always about shapes (``if seq_len > window``, ``for t in
x.shape``). Every node here has an example value (``node.meta["val"]``) and two flags:

* ``value_static``: the value follows from the input *shapes and dtypes* alone;
* ``shape_static`` (tensors): the shape follows from the input shapes alone.

A question about a static value is answered from the example and recorded as a
:class:`~llmc_trace.tracing.guards.Guard` on the trace; a question about a value that depends
on tensor *data* cannot be answered once for all batches, so it raises
:class:`DataDependentQuestion`, which the tracer turns into a located failure.
"""

from __future__ import annotations

import dis
import functools
import inspect
import operator
from collections.abc import Iterator
from types import CodeType
from typing import Any, Protocol

import torch
from torch import fx

#: Attributes whose answer is fixed by the input signature, returned as plain Python values.
CONCRETE_ATTRIBUTES = frozenset({"dtype", "ndim"})


class DataDependentQuestion(Exception):
    """Model code asked ``bool``/``len``/``int``/iteration of a value that depends on data."""

    def __init__(self, question: str, node: fx.Node, reason: str) -> None:
        super().__init__(f"{question}() of a traced value whose {reason}")
        self.question = question
        self.node = node
        self.reason = reason


#: Attributes of the proxy objects themselves (set by fx and by :class:`MetaAttribute`).
_PROXY_FIELDS = frozenset({"node", "tracer", "root", "attr", "_node"})


def set_field(obj: Any, name: str, value: Any) -> Any:
    """Graph target of an attribute assignment on a traced object: set it, return the object."""
    setattr(obj, name, value)
    return obj


class AnsweringTracer(Protocol):
    """What a :class:`MetaProxy` asks of its tracer (``tracing.tracer.LlmcTracer`` is one):
    declared here so that the proxy needs nothing from the module that builds it."""

    def create_proxy(
        self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> MetaProxy: ...

    def answer(self, proxy: fx.Proxy, question: str, *extra: Any) -> Any: ...

    def iter(self, obj: fx.Proxy) -> Iterator[Any]: ...


class MetaProxy(fx.Proxy):
    """Proxy whose node holds an example value; see the module docstring."""

    tracer: AnsweringTracer  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        value = self.node.meta.get("val")
        if name in CONCRETE_ATTRIBUTES and isinstance(value, torch.Tensor):
            return getattr(value, name)
        if name == "shape":
            return self.tracer.create_proxy("call_method", "size", (self,), {})
        if isinstance(value, torch.Tensor) and not hasattr(value, name):
            # as the tensor itself would: hasattr(weight, "SCB") must be False on a plain weight
            raise AttributeError(f"'{type(value).__name__}' object has no attribute '{name}'")
        return MetaAttribute(self, name)

    def __len__(self) -> int:
        return self.tracer.answer(self, "len")

    def __iter__(self) -> Iterator[Any]:
        """``a, b = proxy`` takes its count from the bytecode, as torch.fx does; other iteration
        asks the tracer. fx decodes the caller's whole function on every unpacking (a tenth of
        a second on a 128-expert model); the decoded counts are kept per code object here."""
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        count = _unpack_counts(caller.f_code).get(caller.f_lasti)  # type: ignore[union-attr]
        if count is not None:
            return (self[i] for i in range(count))
        return self.tracer.iter(self)

    def __index__(self) -> int:
        return self.tracer.answer(self, "index")

    def __int__(self) -> int:
        return self.tracer.answer(self, "int")

    def __float__(self) -> float:
        return self.tracer.answer(self, "float")

    def __contains__(self, item: object) -> bool:
        return self.tracer.answer(self, "contains", item)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PROXY_FIELDS:
            object.__setattr__(self, name, value)
            return
        # `outputs.pooler_output = features` (SmolVLM's image features): plain fx sets the
        # attribute on the Proxy object and the graph never sees it. Record the update as a
        # node returning the updated object, and let this proxy stand for it from now on;
        # reading the field back gives the value set, as Python would (a list stays a list).
        updated = self.tracer.create_proxy("call_function", set_field, (self, name, value), {})
        object.__setattr__(self, "node", updated.node)
        object.__setattr__(self, name, value)

    def __setitem__(self, key: Any, value: Any) -> None:
        # torch.fx records no item assignment; without this, Python falls back to __index__
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


@functools.lru_cache(maxsize=4096)
def _unpack_counts(code: CodeType) -> dict[int, int]:
    """Bytecode offset -> element count of every ``UNPACK_SEQUENCE`` in ``code``."""
    return {
        instruction.offset: instruction.argval
        for instruction in dis.get_instructions(code)
        if instruction.opname == "UNPACK_SEQUENCE"
    }


class MetaAttribute(MetaProxy):
    """An attribute of a proxy: a ``getattr`` node, or a method call when it is called.

    Mirrors ``torch.fx.proxy.Attribute`` (the node is created lazily so that ``x.view(...)``
    records one ``call_method`` node, not a ``getattr`` followed by a call).
    """

    def __init__(self, root: MetaProxy, attr: str) -> None:
        self.root = root
        self.attr = attr
        self.tracer = root.tracer
        self._node: fx.Node | None = None

    @property
    def node(self) -> fx.Node:  # type: ignore[override]
        if self._node is None:
            self._node = self.tracer.create_proxy(
                "call_function", getattr, (self.root, self.attr), {}
            ).node
        return self._node

    def __call__(self, *args: Any, **kwargs: Any) -> MetaProxy:
        return self.tracer.create_proxy("call_method", self.attr, (self.root, *args), kwargs)
