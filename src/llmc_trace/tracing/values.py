"""Compute the example value of one traced operation, on real data where possible, else on ``meta``.

Why two kinds of value: tracing a 70B model must allocate nothing, so parameters live on the
``meta`` device and every activation is a shape-only ``meta`` tensor. But the small integer
inputs a processor produces (``input_ids``, ``image_grid_thw``, attention masks) are real, and so
is everything computed from them alone (position ids, rope indices). Keeping those real lets an
opaque function such as a rope-index helper run for real while the big tensors stay ``meta``.

Rules, applied per operation:

1. no ``meta`` tensor among the inputs (and, for modules, no ``meta`` parameter): run it as is,
   with any ``device="meta"`` argument pointed at the CPU; the result is real;
2. otherwise move every input to ``meta`` and run it there; the result is shape-only. Many of
   ``meta``'s kernels are Python (type promotion, broadcasting: 150-250 us per pointwise
   operation), and a model repeats the same operations on the same shapes layer after layer,
   so :class:`MetaMemo` answers a repeated operation from its first result;
3. if ``meta`` cannot run it (the code reads tensor values), run it *mixed*: operation by
   operation (a dispatch mode), real tensors stay real and anything touching a ``meta`` tensor
   runs on ``meta``; only an operation that reads a ``meta`` tensor's values (``.item()``,
   ``.tolist()``, ``nonzero``) gets *phantoms* for its ``meta`` inputs (zero-stride zeros: real
   storage of one element, any shape). So a vision tower whose patch counts come from a real
   ``image_grid_thw`` computes those counts for real and its full-width matrix products on
   ``meta``: seconds of arithmetic thrown away become none. A small ``meta`` tensor made from
   real data alone keeps its real value beside it (:class:`MixedExecution`), so a size that
   passes through ``meta`` is read back, not guessed. Code that even the mixed run cannot
   execute is run whole on phantoms, as a last resort (its matrix products with a phantom
   operand answered as the zeros they are: :class:`PhantomProducts`). Either way the result is
   turned back into ``meta`` and marked as having a shape that may depend on data, since values
   were guessed or read from data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

META = torch.device("meta")
CPU = torch.device("cpu")


@dataclass(frozen=True)
class ComputedValue:
    """The outcome of running one operation for its example value.

    ``beyond_meta``: ``meta`` could not run it, so it ran mixed or on phantoms (rule 3): values
    were read from data or guessed, and the result's shape may depend on them.
    """

    value: Any
    is_real: bool
    beyond_meta: bool
    error: BaseException | None = None


def map_leaves(fn: Callable[[Any], Any], value: Any) -> Any:
    """Apply ``fn`` to every leaf, rebuilding only the containers whose contents changed.

    Unlike ``tree_map``, an untouched dict or list comes back as the *same object*: layers
    may share state through one (see the tracer's ``_shared_container``), and a copy would
    swallow their writes.
    """
    if isinstance(value, dict):
        mapped = {key: map_leaves(fn, item) for key, item in value.items()}
        if all(mapped[key] is item for key, item in value.items()):
            return value
        return type(value)(**mapped) if type(value) is not dict else mapped
    if isinstance(value, (list, tuple)):
        items = [map_leaves(fn, item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*items)
        return type(value)(items)
    return fn(value)


def is_meta_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "meta"


def has_meta_tensor(value: Any) -> bool:
    found = False

    def visit(leaf: Any) -> Any:
        nonlocal found
        found = found or is_meta_tensor(leaf)
        return leaf

    map_leaves(visit, value)
    return found


def to_meta(value: Any) -> Any:
    """Move every tensor and device inside ``value`` to ``meta`` (no data is copied)."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            return leaf.to(META)
        if isinstance(leaf, torch.device):
            return META
        return leaf

    return map_leaves(convert, value)


def meta_devices_to_cpu(value: Any) -> Any:
    """Point ``device=meta`` arguments at the CPU, so shape-derived constructors give real values."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, torch.device) and leaf.type == "meta":
            return CPU
        return leaf

    return map_leaves(convert, value)


def to_phantom(value: Any) -> Any:
    """Replace ``meta`` tensors by zero-stride CPU zeros of the same shape and dtype."""

    def convert(leaf: Any) -> Any:
        if is_meta_tensor(leaf):
            return phantom_of(leaf)
        if isinstance(leaf, torch.device) and leaf.type == "meta":
            return CPU
        return leaf

    return map_leaves(convert, value)


def phantom_of(tensor: torch.Tensor) -> torch.Tensor:
    """A phantom of ``tensor``'s shape and dtype: a CPU zero expanded, one element of storage
    (:func:`is_phantom` recognises it)."""
    return torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)


def module_has_meta_state(module: torch.nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


@contextlib.contextmanager
def phantom_state(module: torch.nn.Module) -> Iterator[None]:
    """Temporarily give a ``meta`` module phantom parameters and buffers, restoring them after."""
    saved: list[tuple[torch.nn.Module, str, str, torch.Tensor]] = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            store = getattr(owner, kind)
            for name, tensor in list(store.items()):
                if tensor is not None and tensor.is_meta:
                    saved.append((owner, kind, name, tensor))
                    phantom = phantom_of(tensor)
                    store[name] = (
                        torch.nn.Parameter(phantom, requires_grad=False)
                        if kind == "_parameters"
                        else phantom
                    )
    try:
        yield
    finally:
        for owner, kind, name, tensor in saved:
            getattr(owner, kind)[name] = tensor


@contextlib.contextmanager
def meta_state(module: torch.nn.Module) -> Iterator[None]:
    """Temporarily move a real module's parameters and buffers to ``meta`` (no copy of data)."""
    saved: list[tuple[torch.nn.Module, str, str, torch.Tensor]] = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            store = getattr(owner, kind)
            for name, tensor in list(store.items()):
                if tensor is not None and not tensor.is_meta:
                    saved.append((owner, kind, name, tensor))
                    moved = tensor.to(META)
                    store[name] = (
                        torch.nn.Parameter(moved, requires_grad=False)
                        if kind == "_parameters"
                        else moved
                    )
    try:
        yield
    finally:
        for owner, kind, name, tensor in saved:
            getattr(owner, kind)[name] = tensor


#: Non-tensor arguments a memo key can hold as they are (hashable, compared by value).
_KEYABLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)


class MetaMemo(TorchDispatchMode):
    """Answer a ``meta`` operation seen before (same op, shapes, strides, dtypes, scalars) with
    fresh ``meta`` tensors of the first answer's shapes, strides and dtypes.

    A ``meta`` result is a function of exactly those. Never answered from memory, always run:
    operations that write into an argument, results that are not all tensors or sit at a storage
    offset, and calls with a real tensor or an unhashable argument. The cache outlives one
    trace (the same shapes recur across the models of a coverage run) up to :attr:`limit`
    entries, then starts over.
    """

    limit = 50_000

    def __init__(self) -> None:
        super().__init__()
        self.results: dict[tuple[Any, ...], tuple[Any, list[tuple[Any, ...]]]] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        return self.call(func, args, kwargs or {})

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = None if func._schema.is_mutable else _memo_key(func, args, kwargs)
        if key is None:
            return func(*args, **kwargs)
        known = self.results.get(key)
        if known is not None:
            spec, layouts = known
            fresh = [
                torch.empty_strided(shape, stride, dtype=dtype, device=META)
                for shape, stride, dtype in layouts
            ]
            return fresh[0] if spec is None else tree_unflatten(fresh, spec)
        result = func(*args, **kwargs)
        # most operations return one tensor: kept without a tree spec, the cheapest to rebuild
        leaves, spec = (
            ([result], None) if isinstance(result, torch.Tensor) else tree_flatten(result)
        )
        if all(isinstance(t, torch.Tensor) and t.storage_offset() == 0 for t in leaves):
            if len(self.results) >= self.limit:
                self.results.clear()
            self.results[key] = (spec, [(t.shape, t.stride(), t.dtype) for t in leaves])
        return result


class _Unkeyable(Exception):
    """An argument a memo key cannot hold (a real tensor, an object compared by identity)."""


def _memo_key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The key of one operation: the op, the default dtype and every argument's layout or
    value, nested as the arguments are; ``None`` when an argument cannot be keyed. Written out
    rather than through ``tree_flatten``: this runs for every ``meta`` operation of a trace."""
    try:
        return (
            func,
            torch.get_default_dtype(),
            tuple(_argument_key(a) for a in args),
            tuple((name, _argument_key(value)) for name, value in kwargs.items()),
        )
    except _Unkeyable:
        return None


def _argument_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if not value.is_meta:
            raise _Unkeyable
        return (torch.Tensor, value.shape, value.stride(), value.dtype, value.storage_offset())
    if isinstance(value, _KEYABLE):
        return (type(value), value)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_argument_key(v) for v in value))
    raise _Unkeyable


#: The memo every ``meta`` evaluation here goes through.
META_MEMO = MetaMemo()


class MixedExecution(TorchDispatchMode):
    """Run each ``aten`` operation on real data when its tensors are all real, else on ``meta``.

    Rule 3 of this module's docstring. Inside an operation handler the mode is off, so the
    calls made here dispatch normally. An operation that ``meta`` cannot run reads values no
    ``meta`` tensor has: its ``meta`` inputs become phantoms, and its tensor results go back to
    ``meta`` unless the operation asked for real data (a copy to the CPU, as ``tolist`` makes).

    A small ``meta`` tensor made from real data alone (a processor's ``image_sizes`` copied to
    the features' device, an ``arange`` of token slots) keeps its real value beside it, and so
    does what is computed from such tensors and real ones: an operation that reads values gets
    those instead of phantoms. Without them Mistral 3 splits its features by sizes read as 0
    and LFM2-VL keeps no token of an image. Values derived from a phantom are never kept.
    """

    #: The most elements a kept value may have: sizes, grids, masks and indices, not
    #: activations (whose arithmetic stays on ``meta``).
    known_limit = 1 << 16

    def __init__(self) -> None:
        super().__init__()
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        inputs = _meta_tensors((*args, *kwargs.values()))
        if not inputs:
            result = func(*args, **kwargs)
            if _meta_tensors(result if isinstance(result, (tuple, list)) else (result,)):
                self._keep(result, func, args, kwargs)  # real data copied to meta, a meta factory
            return result
        known = [t in self.known for t in inputs] if self.known else [False]
        try:
            result = META_MEMO.call(func, tensors_to_meta(args), tensors_to_meta(kwargs))
        except (NotImplementedError, RuntimeError):  # it reads data a meta tensor does not have
            result = func(*self._real(args), **self._real(kwargs))
            if func._schema.is_mutable and not all(known) and any(known):
                self.known.clear()  # a kept value written to from phantoms: no longer true
        else:
            if all(known):
                self._keep(result, func, args, kwargs)
            elif func._schema.is_mutable and any(known):
                self.known.clear()  # a kept value written to from unknown ones: no longer true
            return result
        target = kwargs.get("device")
        if isinstance(target, torch.device) and target.type != "meta":
            return result
        on_meta = tensors_to_meta(result)
        if all(known):
            self._pair(on_meta, result)
        return on_meta

    def _keep(self, result: Any, func: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Compute ``func`` on the kept values of its ``meta`` inputs and keep what it gives
        for each small ``meta`` tensor of ``result`` (writes into kept values happen alike)."""
        outputs, _ = tree_flatten(result)
        metas = [t for t in outputs if is_meta_tensor(t)]
        if not metas or any(t.numel() > self.known_limit for t in metas):
            if func._schema.is_mutable and self.known:
                self.known.clear()
            return
        try:
            real = func(*self._real(args), **self._real(kwargs))
        except Exception:  # noqa: BLE001 - only a value lost: the meta result stands
            if func._schema.is_mutable:
                self.known.clear()
            return
        self._pair(result, real)

    def _pair(self, on_meta: Any, real: Any) -> None:
        metas, _ = tree_flatten(on_meta)
        reals, _ = tree_flatten(real)
        for meta, value in zip(metas, reals):
            if (
                is_meta_tensor(meta)
                and isinstance(value, torch.Tensor)
                and value.shape == meta.shape
                and value.numel() <= self.known_limit
            ):
                self.known[meta] = value

    def _real(self, value: Any) -> Any:
        """``value`` with each ``meta`` tensor replaced by its kept value, else a phantom, and
        ``meta`` devices by the CPU."""

        def convert(leaf: Any) -> Any:
            if is_meta_tensor(leaf):
                kept = self.known.get(leaf)
                return kept if kept is not None else phantom_of(leaf)
            if isinstance(leaf, torch.device) and leaf.type == "meta":
                return CPU
            return leaf

        return map_leaves(convert, value)


def _meta_tensors(values: tuple[Any, ...] | list[Any]) -> list[torch.Tensor]:
    """The ``meta`` tensors among an operation's arguments or results, and in the lists among
    them (an ``aten`` operation nests no deeper): the mixed run asks this of every operation."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(v for v in value if isinstance(v, torch.Tensor) and v.is_meta)
    return found


def tensors_to_meta(value: Any) -> Any:
    """Move every tensor inside ``value`` to ``meta``, leaving device arguments as they are."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            return leaf.to(META)
        return leaf

    return map_leaves(convert, value)


def compute_value(
    run: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    module: torch.nn.Module | None = None,
    allow_phantoms: bool = False,
) -> ComputedValue:
    """Run ``run(*args, **kwargs)`` following the three rules of this module's docstring.

    A call on real inputs alone that fails for a ``meta`` module among its arguments (an opaque
    method's owner, ``call_module_method``'s first, whose weights the method reads) goes on as
    a call of that module would; one that does not read them (a rope index) stays real."""
    module_is_meta = module is not None and module_has_meta_state(module)
    if not has_meta_tensor((args, kwargs)) and not module_is_meta:
        real_args, real_kwargs = meta_devices_to_cpu((args, kwargs))
        try:
            return ComputedValue(run(*real_args, **real_kwargs), True, False)
        except Exception as err:  # the caller decides what an unknown value means
            owner = _module_among((args, kwargs)) if module is None else None
            if owner is None or not module_has_meta_state(owner):
                return ComputedValue(None, False, False, err)
            module, module_is_meta = owner, True
    meta_args, meta_kwargs = to_meta((args, kwargs))
    try:
        if module is not None and not module_is_meta:
            with meta_state(module), META_MEMO:
                return ComputedValue(run(*meta_args, **meta_kwargs), False, False)
        with META_MEMO:
            return ComputedValue(run(*meta_args, **meta_kwargs), False, False)
    except Exception as meta_error:
        if not allow_phantoms:
            return ComputedValue(None, False, False, meta_error)
        try:
            with MixedExecution():
                result = run(*args, **kwargs)
        except Exception:
            try:
                result = _run_on_phantoms(run, args, kwargs, module if module_is_meta else None)
            except Exception:
                return ComputedValue(None, False, False, meta_error)
        return ComputedValue(to_meta(result), False, True)


def _module_among(value: Any) -> torch.nn.Module | None:
    """The first module among ``value``'s leaves (an opaque method's owner), if any."""
    leaves, _ = tree_flatten(value)
    return next((leaf for leaf in leaves if isinstance(leaf, torch.nn.Module)), None)


def _run_on_phantoms(
    run: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    meta_module: torch.nn.Module | None,
) -> Any:
    """Everything real at full size, ``meta`` replaced by phantoms: slow, but runs any code."""
    phantom_args, phantom_kwargs = to_phantom((args, kwargs))
    state = contextlib.nullcontext() if meta_module is None else phantom_state(meta_module)
    with PhantomProducts(), state:
        return run(*phantom_args, **phantom_kwargs)


def is_phantom(value: Any) -> bool:
    """Whether ``value`` is a phantom (:func:`phantom_of`): zeros with every stride 0."""
    return (
        isinstance(value, torch.Tensor)
        and value.numel() > 1
        and not any(value.stride())
        and not value.as_strided((), ()).item()
    )


class PhantomProducts(TorchDispatchMode):
    """Matrix products with a phantom operand answered with their exact result, zeros (plus the
    bias a fused product adds), without running them.

    A product reads a zero-stride operand through a generic kernel: in bfloat16 on the CPU one
    full-size projection of 38 tokens took 3.5 s, against 0.04 s on dense weights, and a model
    run whole on phantoms goes through dozens of them. (A product of zeros with inf or NaN would
    give NaN, not zero; phantom values are guesses either way.)
    """

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _PRODUCTS or kwargs or not any(is_phantom(a) for a in args[-2:]):
            return func(*args, **kwargs)
        left, right = args[-2], args[-1]
        shape = (*left.shape[:-1], right.shape[-1])
        zeros = torch.zeros(shape, dtype=left.dtype, device=left.device)
        if func in (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default):
            zeros.add_(args[0])  # beta = 1: no keyword arguments were given
        return zeros


#: The products :class:`PhantomProducts` answers: their last two arguments are the operands.
_PRODUCTS = (
    torch.ops.aten.mm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.baddbmm.default,
)


def runner_for(kind: str, target: Any, module: torch.nn.Module | None) -> Callable[..., Any]:
    """The callable that computes a graph node of ``kind`` (``call_module``/``method``/``function``)."""
    if kind == "call_module":
        assert module is not None
        return module
    if kind == "call_method":

        def call_method(self_: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self_, target)(*args, **kwargs)

        return call_method
    if kind == "call_function":
        return target
    raise AssertionError(f"no runner for node kind {kind}")


def forget_example_data(graphs: list[Any]) -> None:
    """Replace every node's example value by a ``meta`` tensor of the same shape and dtype.

    A trace on a real batch holds one batch's every intermediate (tens of MiB for a small
    model, far more for a big one); once the graph is partitioned, calibration needs none of
    that data, while shapes and dtypes stay useful for reports.
    """

    def shape_only(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "meta":
            return torch.empty(leaf.shape, dtype=leaf.dtype, device="meta")
        return leaf

    for graph in graphs:
        for node in graph.nodes:
            if "val" in node.meta:
                node.meta["val"] = map_leaves(shape_only, node.meta["val"])
