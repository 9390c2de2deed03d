"""Trace a Hugging Face model's ``forward`` into a torch.fx graph with example values on every node.

transformers 5 ships no ``HFTracer``; this is ours. What it adds to ``torch.fx.Tracer``:

* every node carries an example value (real where it can be, ``meta`` otherwise, see
  :mod:`~llmc_trace.tracing.values`) plus the model source line and module path that made it;
  an opaque call that runs the model's modules (``get_image_features`` recorded whole) names
  them in ``meta["modules_called"]``, for the pipelines to place their weights;
* ``bool``/``len``/``int``/iteration of values that follow from shapes are answered from the
  example and recorded as guards; the same questions about data-dependent values raise
  :class:`~llmc_trace.tracing.proxy.DataDependentQuestion` at the model's own line;
* leaves are decided by the caller (sequential targets, ignored modules, and modules that hold
  no target), so nothing inside a decoder layer is traced;
* configs and other objects the model passes around are referenced by their attribute path,
  never rebuilt, so runtime attributes such as ``_attn_implementation`` survive;
* plain objects the graph rebuilds (a ``DynamicCache``) keep what leaves write into them: the
  new state is read back from the run-time object after the call (``_read_back``);
* random draws are graph calls whatever their arguments, never a trace-time draw baked in;
* ``ModelOutput`` results stay ``ModelOutput`` objects in the graph;
* nothing is written to the model: tensor constants live in the graph, not on the root.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import types
from collections import UserDict
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx
from torch.utils._pytree import tree_flatten

from llmc_trace.errors import VerificationError
from llmc_trace.tracing.dynamic import DynamicDims, fresh_meta, moved_dimensions, with_sentinels
from llmc_trace.tracing.guards import Guard, ask
from llmc_trace.tracing.mutation import writes_in_place
from llmc_trace.tracing.opaque import (
    MASKING_MODULE,
    ExplicitMasks,
    call_module_method,
    draw_from,
    patch_constructors,
    patch_opaque,
    patch_random_draws,
)
from llmc_trace.tracing.proxy import DataDependentQuestion, MetaProxy
from llmc_trace.tracing.rebuild import (
    Constant,
    GraphTarget,
    RebuildFunction,
    RebuildObject,
    Unrepresentable,
    closure_cells,
    copied_objects,
    example_copy,
    fresh_instance,
    is_rebuildable_object,
    read_state,
    state_after,
    state_fingerprint,
    tensor_versions,
)
from llmc_trace.tracing.source import current_model_location
from llmc_trace.tracing.values import (
    ComputedValue,
    compute_value,
    map_leaves,
    module_has_meta_state,
    runner_for,
)

#: Values a graph holds as literals, never as a read of the module attribute that stores them.
_LITERALS = (
    int,
    float,
    str,
    bool,
    type(None),
    tuple,
    list,
    dict,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class WeightMutation(Exception):
    """Model code writes, in place, to one of the model's own parameters or buffers.

    One graph cannot hold such a write: a calibration pass would repeat it on every batch
    (RWKV's forward divides its output weights by powers of two the first time it runs).
    """

    def __init__(self, node: fx.Node, weight: str, operation: str) -> None:
        super().__init__(f"{operation} writes in place to the model's own tensor {weight}")
        self.node = node
        self.weight = weight
        self.operation = operation


#: Methods and functions whose result depends only on the *shape* of their tensor argument.
METADATA_OPS = frozenset(
    {
        "size",
        "dim",
        "numel",
        "nelement",
        "is_floating_point",
        "is_complex",
        "element_size",
        "stride",
        "is_contiguous",
        "get_device",
        "shape",
        "dtype",
        "ndim",
        "device",
        "is_cuda",
        "layout",
        "is_meta",
    }
)
#: Operations whose output *shape* depends on the values of their inputs.
DATA_DEPENDENT_SHAPE_OPS = frozenset(
    {
        "nonzero",
        "masked_select",
        "unique",
        "unique_consecutive",
        "argwhere",
        "repeat_interleave",
        "bincount",
        "histc",
        "tolist",
        "item",
        "where_1arg",
    }
)
#: Tensor constructors: their shape comes from their (non-tensor) arguments' values.
CONSTRUCTORS = frozenset(
    {
        "arange",
        "zeros",
        "ones",
        "full",
        "empty",
        "rand",
        "randn",
        "randint",
        "linspace",
        "eye",
        "tensor",
        "as_tensor",
        "logspace",
        "tril_indices",
        "triu_indices",
    }
)


def op_name(target: Any) -> str:
    """A short, stable name for a node target (function, method name or module path)."""
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", type(target).__name__)


@dataclass
class TraceState:
    """What a trace learned besides the graph: guards, opaque matches, leaves."""

    guards: list[Guard] = field(default_factory=list)
    opaque_matches: dict[str, list[str]] = field(default_factory=dict)
    opaque_recorded: list[str] = field(default_factory=list)  # names that became graph nodes
    leaf_calls: dict[str, str] = field(default_factory=dict)  # module path -> reason
    #: The exception that is unwinding through module calls, with the ``(path, class)`` stack
    #: at its innermost module call (outer calls see the same object and keep it).
    raised: tuple[BaseException, list[tuple[str, str]]] | None = None


class TensorConstant(GraphTarget):
    """Graph target returning a tensor that the model code built outside any module.

    torch.fx would store such a tensor as ``_tensor_constant0`` on the root module; we keep it in
    the graph so tracing never writes to the user's model.
    """

    def __init__(self, tensor: torch.Tensor, index: int) -> None:
        super().__init__(f"tensor_constant_{index}")
        self.tensor = tensor

    def __call__(self) -> torch.Tensor:
        return self.tensor


def build_model_output(class_path: str, fields: dict[str, Any]) -> Any:
    """Graph target rebuilding a ``ModelOutput`` of class ``class_path`` from its fields."""
    module_name, _, class_name = class_path.rpartition(".")
    cls = getattr(__import__(module_name, fromlist=[class_name]), class_name)
    return cls(**fields)


class LlmcTracer(fx.Tracer):
    """HF-aware torch.fx tracer; see the module docstring.

    ``is_leaf`` decides leaves by module path; ``opaque`` names functions and methods recorded
    as single calls (see :mod:`~llmc_trace.tracing.opaque`); ``explicit_masks`` has mask
    builders always build their mask (see
    :func:`~llmc_trace.tracing.opaque.skipped_mask_reaches_traced_code`).
    """

    def __init__(
        self,
        is_leaf: Callable[[str, torch.nn.Module], str | None],
        opaque: list[str],
        *,
        explicit_masks: bool = False,
    ):
        super().__init__(autowrap_modules=(math,))
        self._explicit_masks = explicit_masks
        self.proxy_buffer_attributes = True
        self._is_leaf = is_leaf
        self._opaque_names = list(opaque)
        self._opaque_targets: set[int] = set()
        self.state = TraceState()
        self.module_stack: list[tuple[str, str]] = []  # (path, class name), outermost first
        self._constant_count = 0
        self._containers: dict[int, tuple[MetaProxy, Any]] = {}  # id -> (proxy, keep-alive)
        self._shape_only_outputs: dict[tuple[Any, ...], ComputedValue] = {}
        self._module_shapes: dict[int, tuple[Any, ...]] = {}
        # id -> (node, state fingerprint, keep-alive) of objects the graph rebuilds
        self._rebuilt: dict[int, tuple[fx.Node, tuple[Any, ...], Any]] = {}
        self._rebuilding: set[int] = set()
        # while example values are computed, fx's patched Module.__call__ and __getattr__ pass
        # straight through (reverting and re-applying the patches instead sets attributes on
        # nn.Module, which costs as much as the subclasses loaded: 0.3 s per trace of a
        # 128-expert model once a hundred architectures are imported)
        self._computing = False
        # the paths of the modules run while an opaque call's value is computed
        self._called: list[str] | None = None

    # ----------------------------------------------------------------- entry point
    def trace_model(
        self, model: torch.nn.Module, inputs: dict[str, Any], concrete: dict[str, Any]
    ) -> fx.Graph:
        """Trace ``model(**inputs, **concrete)``: tensors in ``inputs`` become placeholders."""
        self._inputs = inputs
        self._concrete = concrete
        # one walk of the modules (tens of milliseconds each on a model with thousands of
        # experts) answers every path question: a tied weight or shared module keeps its last
        # path, as named_parameters(remove_duplicate=False) would give it
        self._param_paths: dict[int, str] = {}
        self._buffer_paths: dict[int, str] = {}
        self._module_paths: dict[int, str] = {}
        self._object_paths: dict[int, str] = {}
        traced: list[tuple[str, torch.nn.Module]] = []
        for path, module in model.named_modules(remove_duplicate=False):
            prefix = f"{path}." if path else ""
            if id(module) not in self._module_paths and self._is_leaf(path, module) is None:
                traced.append((path, module))
            self._module_paths[id(module)] = path
            for name, tensor in module._parameters.items():
                if tensor is not None:
                    self._param_paths[id(tensor)] = prefix + name
            for name, tensor in module._buffers.items():
                if tensor is not None:
                    self._buffer_paths[id(tensor)] = prefix + name
            self._collect_object_paths(prefix, module)
        attributes = {
            (id(m), key): value
            for _, m in traced
            for key, value in vars(m).items()
            if not key.startswith("_")
        }
        try:
            with (
                patch_opaque(
                    self._opaque_names,
                    traced,
                    self._record_function,
                    self._record_method,
                    self.has_proxy,
                ) as matches,
                patch_constructors(self._record_constructor, self.has_proxy),
                patch_random_draws(self._record_draw),
            ):
                self.state.opaque_matches = matches
                return self.trace(model)
        finally:
            _restore_proxy_attributes(traced, attributes)

    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Callable[..., Any], list[Any]]:
        names = list(self._inputs)

        def root_with_keywords(root: torch.nn.Module, *values: Any) -> Any:
            return root_fn(root, **dict(zip(names, values)), **self._concrete)

        placeholders = [self.create_proxy("placeholder", name, (), {}) for name in names]
        return root_with_keywords, [self.root, *placeholders]

    # ----------------------------------------------------------------- proxies and values
    def proxy(self, node: fx.Node) -> MetaProxy:
        return MetaProxy(node, self)

    def has_proxy(self, value: Any) -> bool:
        leaves, _ = tree_flatten(value)
        return any(isinstance(leaf, fx.Proxy) for leaf in leaves)

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any = None,
        proxy_factory_fn: Callable[[fx.Node], fx.Proxy] | None = None,
    ) -> MetaProxy:
        if kind == "call_module" or id(target) in self._opaque_targets:
            args = tuple(self._shared_container(a) for a in args)
            kwargs = {k: self._shared_container(v) for k, v in kwargs.items()}
        if writes_in_place(kind, target, kwargs) and args and isinstance(args[0], fx.Proxy):
            weight = self._weight_behind(args[0].node)
            if weight is not None:
                raise WeightMutation(args[0].node, weight, str(getattr(target, "__name__", target)))
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr)
        self._annotate(proxy.node, kind, target, args, kwargs)
        return proxy  # type: ignore[return-value]

    def _weight_behind(self, node: fx.Node) -> str | None:
        """The parameter or buffer ``node`` is, or holds as an attribute (``weight.SCB``).

        Judged by the example value, not by how the node was reached: a weight read through
        the module a recorded call returned is still the weight.
        """
        while True:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor):
                path = self._param_paths.get(id(value)) or self._buffer_paths.get(id(value))
                if path is not None:
                    return path
            if not (node.op == "call_function" and node.target is getattr):
                return None
            node = node.args[0]  # type: ignore[assignment]

    def _annotate(
        self, node: fx.Node, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        node.meta["source"] = current_model_location()
        path, cls = self.module_stack[-1] if self.module_stack else ("", type(self.root).__name__)
        node.meta["module_path"] = path
        node.meta["module_class"] = cls
        if kind == "placeholder":
            value = self._inputs[target]
            node.meta.update(val=value, value_static=False, shape_static=True, is_real=True)
            return
        if kind == "get_attr":
            value = self._resolve_attr(target)
            node.meta.update(
                val=value,
                value_static=False,
                shape_static=True,
                is_real=not (isinstance(value, torch.Tensor) and value.is_meta),
            )
            return
        values = _map_proxies(lambda p: p.node.meta.get("val"), (args, kwargs), self._object_paths)
        arg_nodes = [
            leaf.node for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, fx.Proxy)
        ]
        module = self.root.get_submodule(target) if kind == "call_module" else None
        run = runner_for(kind, target, module)
        opaque = kind == "call_module" or id(target) in self._opaque_targets
        key = self._shape_only_key(module, values) if module is not None else None
        handed: list[tuple[Any, Any]] = []  # an object makes the key None: never cached
        before: list[tuple[tuple[Any, ...], dict[int, int]]] = []
        if key is not None and key in self._shape_only_outputs:
            cached = self._shape_only_outputs[key]
            computed = dataclasses.replace(cached, value=map_leaves(_fresh_meta, cached.value))
        else:
            called: list[str] = []
            # an opaque call runs on copies of the objects it is handed: what it changes in
            # them, model code reads back after it (see _read_back)
            if opaque:
                handed = copied_objects((args, kwargs), values)
            before = [(state_fingerprint(c), tensor_versions(c)) for _, c in handed]
            with (
                self._computing_values(),
                self._recording_calls(called if module is None else None),
            ):
                computed = compute_value(
                    run, values[0], values[1], module=module, allow_phantoms=opaque
                )
            if key is not None and not computed.is_real and computed.error is None:
                self._shape_only_outputs[key] = computed
            if called:  # an opaque method ran its owner's modules: a pipeline must place them
                node.meta["modules_called"] = _outermost(called)
        node.meta["val"] = computed.value
        node.meta["is_real"] = computed.is_real
        if computed.error is not None:
            node.meta["value_error"] = f"{type(computed.error).__name__}: {computed.error}"
        value_static, shape_static = _static_flags(kind, target, arg_nodes, args, computed.value)
        dims: DynamicDims = None
        if computed.beyond_meta or computed.error is not None:
            shape_static = False
        elif shape_static and not all(n.meta.get("shape_static", False) for n in arg_nodes):
            dims = self._dynamic_dims(run, args, kwargs, computed.value)
            shape_static = dims is not None and not any(dims)
        node.meta["value_static"], node.meta["shape_static"] = value_static, shape_static
        if not shape_static:
            node.meta["dynamic_dims"] = dims
        if computed.error is None:
            for (obj, copy), (fingerprint, versions) in zip(handed, before):
                if (state_fingerprint(copy), tensor_versions(copy)) != (fingerprint, versions):
                    self._read_back(obj, copy, node, versions)

    def _read_back(self, obj: Any, changed: Any, call: fx.Node, versions: dict[int, int]) -> None:
        """``call`` changed ``obj`` (its example copy, ``changed``, says how): give ``obj`` the
        new state, each new or rewritten tensor a read of the run-time object after the call.

        At run time the call changes the very object it is handed, as in eager code. But the
        example value was computed on a copy, so without this the trace would go on seeing the
        object as it was: PI0's language model fills a ``DynamicCache`` in its decoder layers
        (leaves), then its action expert asks the cache's length and builds a mask over it.
        The reads hang off a node that takes the call as an argument, so a partition can never
        place a reader of the changed state before the call that changed it.
        """
        rebuilt = self._rebuilt.get(id(obj))
        if rebuilt is None:  # reached through no node of its own: nothing to read back from
            return
        after = self.create_node("call_function", state_after, (rebuilt[0], call), {})
        self._holding(after, changed, False)
        shape_static = call.meta.get("shape_static", False)

        def read(value: torch.Tensor, path: tuple[Any, ...]) -> MetaProxy:
            node = self.create_node("call_function", read_state, (after, path), {})
            self._holding(node, value, False)
            node.meta["shape_static"] = shape_static
            return self.proxy(node)

        def mirror(old: Any, new: Any, path: tuple[Any, ...]) -> Any:
            if isinstance(old, fx.Proxy) and old.node.meta.get("val") is new:
                if not isinstance(new, torch.Tensor) or versions.get(id(new)) == new._version:
                    return old  # the call left it alone: the recorded value stands
            if isinstance(new, torch.Tensor):
                return read(new, path)
            if isinstance(new, list):
                items = [mirror(_item(old, i), x, (*path, i)) for i, x in enumerate(new)]
                if isinstance(old, list):
                    old[:] = items
                    return old
                return items
            if type(new) is dict:
                entries = {k: mirror(_item(old, k), x, (*path, k)) for k, x in new.items()}
                if type(old) is dict:
                    old.clear()
                    old.update(entries)
                    return old
                return entries
            if isinstance(new, tuple) and not hasattr(new, "_fields"):
                return tuple(mirror(_item(old, i), x, (*path, i)) for i, x in enumerate(new))
            if is_rebuildable_object(new):
                kept = old if type(old) is type(new) else fresh_instance(type(new), {})
                own = vars(kept) if kept is old else {}
                state = {k: mirror(own.get(k), x, (*path, k)) for k, x in vars(new).items()}
                vars(kept).clear()
                vars(kept).update(state)
                return kept
            return new

        mirror(obj, changed, ())
        self._rebuilt[id(obj)] = (after, state_fingerprint(obj), obj)

    def _dynamic_dims(
        self, run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], value: Any
    ) -> DynamicDims:
        """The dimensions of ``value`` that an input's data-dependent sizes reach (see
        :mod:`~llmc_trace.tracing.dynamic`): the operation derived again with those sizes moved."""

        def sentinel(proxy: fx.Proxy) -> Any:
            node = proxy.node
            if node.meta.get("shape_static", False):
                return fresh_meta(node.meta.get("val"))
            return with_sentinels(node.meta.get("val"), node.meta.get("dynamic_dims"))

        try:
            moved_args, moved_kwargs = _map_proxies(sentinel, (args, kwargs), self._object_paths)
        except RuntimeError:  # sentinel sizes too large for one tensor: nothing is proved
            return None
        with self._computing_values():
            return moved_dimensions(run, moved_args, moved_kwargs, value)

    def _shared_container(self, value: Any) -> Any:
        """A dict or list handed to a leaf becomes one graph node, created once per forward.

        Layers may share state by mutating such a container (one fills it, a later one reads
        it). Baked into each call as a constant, every call would get its own copy and the
        writes would be lost; as a node, all calls receive the same fresh object at run time.
        """
        if not _is_shared_container(value):
            return value
        if id(value) not in self._containers:
            cls = type(value)
            items = dict(value) if isinstance(value, (dict, UserDict)) else list(value)
            node = self.create_node(
                "call_function",
                new_container,
                (f"{cls.__module__}.{cls.__qualname__}", self.create_arg(items)),
                {},
            )
            node.meta.update(
                val=value,
                value_static=False,
                shape_static=True,
                is_real=True,
                source=current_model_location(),
                module_path="",
                module_class="",
            )
            self._containers[id(value)] = (self.proxy(node), value)
        return self._containers[id(value)][0]

    def _shape_only_key(self, module: torch.nn.Module, values: Any) -> tuple[Any, ...] | None:
        """A key under which identical layers share one shape-only output.

        Eighty decoder layers of one class, with the same parameter shapes, called on inputs of
        the same shapes, give outputs of the same shapes: computing that once is enough. Only
        for modules with ``meta`` state, whose outputs are never real. A ``meta`` input counts by
        its shape; a real one (``position_ids``, a mask, a router's token counts) may be read
        for its values (:func:`~llmc_trace.tracing.values.compute_value`'s mixed run), so it
        counts as the very tensor it is, unmodified: all layers receive the same one.
        """
        signature: list[Any] = []
        unkeyable = False

        def visit(leaf: Any) -> Any:
            nonlocal unkeyable
            if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                signature.append((tuple(leaf.shape), leaf.dtype))
            elif isinstance(leaf, torch.Tensor) and not leaf.is_inference():
                signature.append((id(leaf), leaf._version))  # inference tensors have no version
            elif leaf is None or isinstance(leaf, (int, float, str, bool, torch.dtype)):
                signature.append(leaf)
            else:
                unkeyable = True
            return leaf

        map_leaves(visit, values)
        if unkeyable or not module_has_meta_state(module):
            return None
        if id(module) not in self._module_shapes:
            self._module_shapes[id(module)] = tuple(
                (name, tuple(p.shape), p.dtype) for name, p in module.named_parameters()
            )
        return (type(module), self._module_shapes[id(module)], tuple(signature))

    def _resolve_attr(self, target: str) -> Any:
        # fx patches Module.__getattr__ to emit get_attr nodes; reading through it here would
        # recurse, so resolve as plain attribute reads
        value: Any = self.root
        with self._computing_values():
            for atom in target.split("."):
                value = getattr(value, atom)
        return value

    @contextlib.contextmanager
    def _computing_values(self) -> Iterator[None]:
        previous, self._computing = self._computing, True
        try:
            yield
        finally:
            self._computing = previous

    @contextlib.contextmanager
    def _recording_calls(self, called: list[str] | None) -> Iterator[None]:
        previous, self._called = self._called, called
        try:
            yield
        finally:
            self._called = previous

    @property
    def computing(self) -> bool:
        """Whether the tracer is computing an example value (a leaf's or an opaque call's
        code runs for real, recording nothing in the graph)."""
        return self._computing

    # ----------------------------------------------------------------- questions on proxies
    def answer(self, proxy: fx.Proxy, question: str, *extra: Any) -> Any:
        """Answer ``bool``/``len``/``int``/... of a proxy from its example, recording a guard."""
        node = proxy.node
        value = node.meta.get("val")
        if question in ("len", "iter") and isinstance(value, torch.Tensor):
            static = node.meta.get("shape_static", False)
            reason = "shape depends on tensor data"
        elif question in ("len", "iter") and isinstance(value, (tuple, list, dict)):
            static = op_name(node.target) not in ("tolist",) or node.meta.get("value_static")
            reason = "length depends on tensor data"
        else:
            static = node.meta.get("value_static", False)
            reason = "value depends on tensor data"
        if not static:
            raise DataDependentQuestion(question, node, reason)
        if isinstance(value, torch.Tensor) and value.is_meta and question not in ("len", "iter"):
            raise DataDependentQuestion(question, node, "value is unknown on the meta device")
        result = ask(question, value, *extra)
        argument = extra[0] if question == "contains" else None
        self.state.guards.append(
            Guard(node.name, question, _plain(result), current_model_location(), argument)
        )
        return result

    def to_bool(self, obj: fx.Proxy) -> bool:
        return self.answer(obj, "bool")

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        value = obj.node.meta.get("val")
        if isinstance(value, dict):
            keys = list(value.keys())
            return iter(keys)
        count = self.answer(obj, "iter")
        return (obj[index] for index in range(count))

    def keys(self, obj: fx.Proxy) -> Any:
        value = obj.node.meta.get("val")
        if isinstance(value, dict):
            return list(value.keys())
        raise DataDependentQuestion("keys", obj.node, "value is not a mapping")

    # ----------------------------------------------------------------- modules and leaves
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(module_qualified_name, m) is not None

    def call_module(
        self,
        m: torch.nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if self._computing:
            if self._called is not None and id(m) in self._module_paths:
                self._called.append(self._module_paths[id(m)])
            return forward(*args, **kwargs)
        path = self._module_paths.get(id(m))
        if path is None:  # a module built during forward: not addressable, so trace through it
            return forward(*args, **kwargs)
        reason = self._is_leaf(path, m)
        self.module_stack.append((path, type(m).__name__))
        try:
            if reason is not None:
                self.state.leaf_calls.setdefault(path, reason)
                return self.create_proxy("call_module", path, args, kwargs)
            return forward(*args, **kwargs)
        except Exception as err:
            if self.state.raised is None or self.state.raised[0] is not err:
                self.state.raised = (err, list(self.module_stack))
            raise
        finally:
            self.module_stack.pop()

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._computing:
            return attr_val
        if isinstance(attr_val, torch.Tensor):
            path = self._param_paths.get(id(attr_val)) or self._buffer_paths.get(id(attr_val))
            if path is not None:
                if path not in parameter_proxy_cache:
                    parameter_proxy_cache[path] = self.create_proxy("get_attr", path, (), {})
                return parameter_proxy_cache[path]
        return attr_val

    # ----------------------------------------------------------------- arguments
    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not isinstance(a, fx.Proxy):
            path = self._param_paths.get(id(a)) or self._buffer_paths.get(id(a))
            if path is None:
                path = self.tensor_attrs.get(a)
            if path is not None:
                return self._holding(self.create_node("get_attr", path, (), {}), a, False)
            self._constant_count += 1
            constant = TensorConstant(a, self._constant_count)
            return self._holding(self.create_node("call_function", constant, (), {}), a, True)
        if isinstance(a, torch.nn.Module) and id(a) in self._module_paths:
            node = self.create_node("get_attr", self._module_paths[id(a)], (), {})
            return self._holding(node, a, True)
        if _is_model_output(a):
            fields = {key: self.create_arg(value) for key, value in a.items()}
            class_path = f"{type(a).__module__}.{type(a).__qualname__}"
            return self.create_node("call_function", build_model_output, (class_path, fields), {})
        if isinstance(a, np.generic):
            # a NumPy scalar (CTRL scales by np.sqrt(d_model)) is the Python number it holds:
            # the generated code cannot name NumPy, and torch treats both alike
            return super().create_arg(a.item())
        if id(a) in self._object_paths:  # never a literal: those are left out of the paths
            node = self.create_node("get_attr", self._object_paths[id(a)], (), {})
            return self._holding(node, a, True)
        try:
            return super().create_arg(a)
        except NotImplementedError:
            if isinstance(a, type) or (isinstance(a, types.FunctionType) and not a.__closure__):
                self._constant_count += 1
                node = self.create_node("call_function", Constant(a, self._constant_count), (), {})
                return self._holding(node, a, True)
            if isinstance(a, types.FunctionType):
                return self._rebuild_function(a)
            if is_rebuildable_object(a):
                return self._rebuild_object(a)
            raise

    def _holding(self, node: fx.Node, value: Any, value_static: bool) -> fx.Node:
        """Annotate a node made for an argument as :meth:`_annotate` does a recorded one:
        shape and value flags must not read as unknown where it is used."""
        if "val" not in node.meta:
            node.meta.update(
                val=value,
                value_static=value_static,
                shape_static=True,
                is_real=not (isinstance(value, torch.Tensor) and value.is_meta),
                source=current_model_location(),
                module_path=self.module_stack[-1][0] if self.module_stack else "",
                module_class=self.module_stack[-1][1] if self.module_stack else "",
            )
        return node

    def _rebuild_function(self, fn: types.FunctionType) -> fx.Node:
        """A closure as a node that makes it again from its cells (see :mod:`rebuild`)."""
        self._constant_count += 1
        cells = tuple(self.create_arg(cell) for cell in closure_cells(fn))
        node = self.create_node(
            "call_function", RebuildFunction(fn, self._constant_count), cells, {}
        )
        return self._holding(node, fn, _all_static(node))

    def _rebuild_object(self, obj: Any) -> fx.Node:
        """A plain object as a node that makes a fresh one from its state, once per forward
        while traced code leaves that state alone: every call that receives it, leaves
        included, then shares one object at run time, as eager code does."""
        fingerprint = state_fingerprint(obj)
        known = self._rebuilt.get(id(obj))
        if known is not None and known[1] == fingerprint:
            return known[0]
        if id(obj) in self._rebuilding:
            raise Unrepresentable(f"a {type(obj).__name__} whose state refers to itself")
        self._rebuilding.add(id(obj))
        try:
            state = self.create_arg(dict(vars(obj)))
        finally:
            self._rebuilding.discard(id(obj))
        self._constant_count += 1
        node = self.create_node(
            "call_function", RebuildObject(type(obj), self._constant_count), (state,), {}
        )
        self._holding(node, obj, _all_static(node))
        self._rebuilt[id(obj)] = (node, fingerprint, obj)
        return node

    def _collect_object_paths(self, prefix: str, module: torch.nn.Module) -> None:
        """Attribute paths of the non-tensor objects a module holds (configs, chiefly), the
        first path found kept.

        Values the graph can hold as literals are left out: a dtype or device is a shared
        singleton, so ``torch.float32`` reached through ``inputs_embeds.dtype`` would otherwise
        be recorded as a read of whichever module happens to store float32 (Switch's router),
        and the graph would change with the checkpoint's dtype.
        """
        for key, value in vars(module).items():
            if key.startswith("_") or isinstance(value, (torch.Tensor, torch.nn.Module)):
                continue
            if isinstance(value, _LITERALS):
                continue
            self._object_paths.setdefault(id(value), prefix + key)

    # ----------------------------------------------------------------- opaque calls
    def _record_function(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self._opaque_targets.add(id(fn))
        if fn.__name__ not in self.state.opaque_recorded:
            self.state.opaque_recorded.append(fn.__name__)
        is_mask = getattr(fn, "__module__", None) == MASKING_MODULE
        if is_mask and self._explicit_masks:
            fn = ExplicitMasks(fn)
            self._opaque_targets.add(id(fn))
        proxy = self.create_proxy("call_function", fn, args, kwargs)
        return self.unpack(proxy, keep_none=is_mask)

    def opaque_call(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` made into one graph node per call while tracing (autowrap's statements).

        Unlike opaque names, which run directly when no proxy reaches them, every call is
        recorded: a statement moved out of model code must run at calibration time, on the
        batch, never once at trace time on the example.
        """

        @functools.wraps(fn)
        def record(*args: Any, **kwargs: Any) -> Any:
            if any(arg is self.root for arg in args):
                raise TypeError(
                    f"{fn.__name__} reads the root module, which a graph cannot pass as a value; "
                    "autowrap a statement that does not use `self`."
                )
            return self._record_function(fn, args, kwargs)

        return record

    def _record_constructor(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.create_proxy("call_function", fn, args, kwargs)

    def _record_draw(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        method: str | None,
    ) -> Any:
        """A random draw as a graph call, even on plain arguments; its value is never known
        while tracing (the example's numbers are one draw among many). A distribution's
        ``method`` is recorded by name on the distribution, which the graph rebuilds. Inside
        an example's computation the draw simply runs."""
        if self._computing:
            return fn(*args, **kwargs)
        if method is not None:
            fn, args = draw_from, (args[0], method, *args[1:])
        proxy = self.create_proxy("call_function", fn, args, kwargs)
        proxy.node.meta["value_static"] = False
        return proxy

    def _record_method(
        self, module: torch.nn.Module, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        self._opaque_targets.add(id(call_module_method))
        qualified = f"{type(module).__name__}.{name}"
        if qualified not in self.state.opaque_recorded:
            self.state.opaque_recorded.append(qualified)
        return self.unpack(
            self.create_proxy("call_function", call_module_method, (module, name, *args), kwargs),
            keep_none=False,
        )

    def unpack(self, proxy: MetaProxy, *, keep_none: bool = True) -> Any:
        """A proxy of a plain dict, list or tuple becomes that container of item proxies.

        Model code asks ``isinstance(masks, dict)`` of what a mask builder returned; a bare
        proxy would answer no and send tracing down the wrong branch. Unless ``keep_none``,
        an item that is ``None`` for the example stays ``None`` in traced code, with a run-time
        check that it still is (see :func:`expect_none`): traced code asking ``x is None``
        of a proxy always hears no. Mask builders keep theirs: a mask is ``None`` or not
        depending on padding, and only leaves (which decide again per batch) may receive it.
        """
        value = proxy.node.meta.get("val")
        if type(value) is dict:
            return {key: self._item(proxy, key, keep_none) for key in value}
        if type(value) in (list, tuple):
            return type(value)(self._item(proxy, i, keep_none) for i in range(len(value)))
        return proxy

    def _item(self, proxy: MetaProxy, key: Any, keep_none: bool) -> Any:
        item = proxy[key]
        if keep_none or item.node.meta.get("val", False) is not None:
            return item
        where = current_model_location()
        what = f"{proxy.node.name}[{key!r}]" + (f" (at {where})" if where else "")
        self.create_proxy("call_function", expect_none, (item, what), {})
        return None


def expect_none(value: Any, what: str) -> None:
    """Graph target: the run-time check that a recorded call's result is ``None`` again."""
    if value is not None:
        raise VerificationError(
            f"{what} was None when the model was traced, and is a {type(value).__name__} for "
            "this batch: the model's code takes another path for it than for the traced sample.",
            hint="Calibrate on batches shaped like the traced sample, or trace on such a batch.",
        )


def new_container(class_path: str, items: Any) -> Any:
    """Graph target: a fresh container of class ``class_path`` holding ``items``.

    See ``LlmcTracer._shared_container`` for why shared containers are graph nodes.
    """
    module_name, _, class_name = class_path.rpartition(".")
    cls = getattr(__import__(module_name, fromlist=[class_name]), class_name)
    return cls(items)


def _is_shared_container(value: Any) -> bool:
    """Plain and user-defined dicts and lists; ModelOutputs and tuples are values, not state."""
    if isinstance(value, UserDict):
        return True
    return isinstance(value, (dict, list)) and not _is_model_output(value)


def _is_model_output(value: Any) -> bool:
    return any(cls.__name__ == "ModelOutput" for cls in type(value).__mro__[1:])


def _map_proxies(
    fn: Callable[[fx.Proxy], Any], value: Any, shared: Container[int] = frozenset()
) -> Any:
    """``value`` with every proxy replaced by ``fn(proxy)``; closures and plain objects are
    copied around theirs (:func:`~llmc_trace.tracing.rebuild.example_copy`), except the
    objects whose ids are in ``shared`` (the model's own: configs are read, never copied)."""

    def inner(item: Any) -> Any:
        return _map_proxies(fn, item, shared)

    if isinstance(value, fx.Proxy):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(inner(v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(inner(v) for v in value)
    if isinstance(value, dict) and not _is_model_output(value):
        return {k: inner(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(inner(value.start), inner(value.stop), inner(value.step))
    if id(value) in shared:
        return value
    if (isinstance(value, types.FunctionType) and value.__closure__) or is_rebuildable_object(
        value
    ):
        return example_copy(value, inner, shared)
    return value


def _fresh_meta(leaf: Any) -> Any:
    """A new meta tensor of the same shape (cached outputs are never shared between nodes)."""
    return torch.empty_like(leaf) if isinstance(leaf, torch.Tensor) else leaf


def _restore_proxy_attributes(
    modules: list[tuple[str, torch.nn.Module]], before: dict[tuple[int, str], Any]
) -> None:
    """Undo ``self.x = <proxy>`` assignments made by model code while tracing.

    Qwen2-VL stores ``self.rope_deltas`` during forward; a proxy left there would break the
    next eager call. Only attributes holding proxies are touched.
    """
    for _, module in modules:
        for key, value in list(vars(module).items()):
            if isinstance(value, fx.Proxy):
                if (id(module), key) in before:
                    setattr(module, key, before[(id(module), key)])
                else:
                    delattr(module, key)


def _item(container: Any, key: Any) -> Any:
    """``container[key]`` where the container holds it, else ``None``."""
    if isinstance(container, (list, tuple)):
        return container[key] if isinstance(key, int) and key < len(container) else None
    if type(container) is dict:
        return container.get(key)
    return None


def _all_static(node: fx.Node) -> bool:
    return all(n.meta.get("value_static", False) for n in node.all_input_nodes)


def _holds_tensors(value: Any) -> bool:
    """Tensors and containers of tensors: their *shapes*, not values, decide output shapes.

    A function argument counts too: mask functions and other callbacks decide what the
    elements of a result are, never its shape."""
    if isinstance(value, (torch.Tensor, types.FunctionType)):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


def _static_flags(
    kind: str, target: Any, arg_nodes: list[fx.Node], args: tuple[Any, ...], value: Any
) -> tuple[bool, bool]:
    """(value_static, shape_static) of a new node from those of its inputs.

    For an operation, ``shape_static`` leaves out its tensor inputs' data-dependent sizes:
    whether those reach the result is derived from the operation itself (the tracer's
    ``_dynamic_dims``). A module call, whose code no one derives again, inherits them.
    """
    name = op_name(target)
    if kind == "call_function" and target is getattr:
        name = args[1]
    if name in METADATA_OPS or (kind == "call_function" and target in (torch.numel,)):
        subject = arg_nodes[0] if arg_nodes else None  # the tensor asked about
        return subject is not None and subject.meta.get("shape_static", False), True
    values_static = all(n.meta.get("value_static", False) for n in arg_nodes)
    non_tensor_static = all(
        n.meta.get("value_static", False)
        for n in arg_nodes
        if not _holds_tensors(n.meta.get("val"))
    )
    data_dependent = name in DATA_DEPENDENT_SHAPE_OPS and not _repeats_by_count(name, args)
    shape_static = non_tensor_static and not data_dependent
    if name in CONSTRUCTORS:
        shape_static = values_static
    if kind == "call_function" and target is operator.getitem:
        index_node = args[1].node if isinstance(args[1], fx.Proxy) else None
        index_value = index_node.meta.get("val") if index_node is not None else None
        if isinstance(index_value, torch.Tensor) and index_value.dtype == torch.bool:
            shape_static = False
    if kind == "call_module":
        shapes_static = all(n.meta.get("shape_static", False) for n in arg_nodes)
        return False, shape_static and shapes_static
    return values_static, shape_static


def _repeats_by_count(name: str, args: tuple[Any, ...]) -> bool:
    """``repeat_interleave(x, 2)``: a number of repeats (not a tensor of them) fixes the shape,
    as rotary embeddings use it."""
    if name != "repeat_interleave" or len(args) < 2:
        return False
    repeats = args[1]
    if isinstance(repeats, fx.Proxy):
        return repeats.node.meta.get("value_static", False) and isinstance(
            repeats.node.meta.get("val"), int
        )
    return isinstance(repeats, int)


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def _outermost(paths: list[str]) -> list[str]:
    """The module paths of ``paths`` inside none of the others, in first-call order."""
    kept = dict.fromkeys(paths)
    return [path for path in kept if not any(path.startswith(f"{other}.") for other in kept)]
