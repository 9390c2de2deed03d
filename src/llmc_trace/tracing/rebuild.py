"""Python functions and objects that hold traced values, rebuilt by the graph at run time.

A graph argument must be something ``torch.fx`` can write as code: tensors, numbers,
containers, nodes. Model code also hands recorded calls *closures* (Gemma 3 passes
``or_mask_function=blockwise_overlay(block_ids)`` to the mask builder; Idefics3 passes
``lambda: f"... {mask.sum()} ..."`` to ``torch_compilable_check``) and returns *objects*
(a ``DynamicCache`` whose layers hold keys and values). Baked in as constants they would keep
the trace-time proxies inside them, or one object would be shared by every calibration batch.

So each becomes a node that rebuilds it at run time: a closure from its code and its cells, an
object as a fresh instance of its class with its attribute state, every cell or attribute
itself a graph argument (a proxy becomes the batch's value). The graph then computes, for each
batch, the same function or object that eager code would have built.
"""

from __future__ import annotations

import abc
import types
from collections.abc import Callable, Container, Iterable
from typing import Any

import torch
from torch import fx


class Unrepresentable(TypeError):
    """A value a graph can neither hold nor rebuild (a closure over a name not yet assigned, an
    object whose state refers to itself): tracing stops there, as at any unsupported argument."""


class GraphTarget:
    """A callable object a graph node calls: ``torch.fx`` writes a ``call_function`` target as
    code by its ``__module__`` and ``__name__``, so each instance gets a name of its own (the
    object itself goes into the generated code's globals)."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name
        self.__module__ = type(self).__module__


class Constant(GraphTarget):
    """Graph target returning a value that needs no rebuilding: a class, a function that closes
    over nothing. ``torch.fx`` can only write such values as code when they are call targets."""

    def __init__(self, value: Any, index: int) -> None:
        super().__init__(f"constant_{getattr(value, '__name__', 'value').strip('<>')}_{index}")
        self.value = value

    def __call__(self) -> Any:
        return self.value


class RebuildFunction(GraphTarget):
    """Graph target: ``fn``'s code with its closure cells filled by the call's arguments."""

    def __init__(self, fn: types.FunctionType, index: int) -> None:
        super().__init__(f"rebuild_{fn.__name__.strip('<>')}_{index}")
        self.template = fn

    def __call__(self, *cells: Any) -> types.FunctionType:
        fn = self.template
        rebuilt = types.FunctionType(
            fn.__code__,
            fn.__globals__,
            fn.__name__,
            fn.__defaults__,
            tuple(types.CellType(value) for value in cells),
        )
        rebuilt.__kwdefaults__ = fn.__kwdefaults__
        return rebuilt


class RebuildObject(GraphTarget):
    """Graph target: a fresh instance of ``cls`` whose attributes are the call's argument."""

    def __init__(self, cls: type, index: int) -> None:
        super().__init__(f"rebuild_{cls.__name__}_{index}")
        self.cls = cls

    def __call__(self, state: dict[str, Any]) -> Any:
        return fresh_instance(self.cls, state)


def fresh_instance(cls: type, state: Iterable[tuple[str, Any]] | dict[str, Any]) -> Any:
    """An instance of ``cls`` with ``state`` as its attributes, ``__init__`` not run (see
    :func:`is_rebuildable_object` for the classes this is right for)."""
    instance = cls.__new__(cls)
    vars(instance).update(state)
    return instance


def closure_cells(fn: types.FunctionType) -> list[Any]:
    """The values a function closes over, in the order its code expects them.

    An empty cell (a name assigned after the function was made) cannot be rebuilt.
    """
    values = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values.append(cell.cell_contents)
        except ValueError as err:
            raise Unrepresentable(
                f"{fn.__qualname__} closes over {name!r} before it is assigned"
            ) from err
    return values


def is_rebuildable_object(value: Any) -> bool:
    """A plain Python object: its whole state is its ``__dict__``, and a fresh instance can be
    made without running ``__init__``. Modules, tensors, classes and functions are not."""
    if isinstance(value, (torch.Tensor, torch.nn.Module, type, types.FunctionType)):
        return False
    if isinstance(value, (fx.Proxy, fx.Node)):  # graph values, never state to copy
        return False
    cls = type(value)
    if "__slots__" in vars(cls) or not hasattr(value, "__dict__"):
        return False
    return cls.__new__ is object.__new__ and type(cls) in (type, abc.ABCMeta)


def example_copy(
    value: Any, example: Callable[[Any], Any], shared: Container[int] = frozenset()
) -> Any:
    """A copy of a closure or plain object, proxies inside replaced by ``example(proxy)``.

    Example values are computed by running model code on plain tensors. A closure still
    holding a proxy would record graph nodes from inside that computation, and a leaf computed
    on the object itself (a decoder layer updating a ``DynamicCache``) would change the state
    the graph records. So closures, objects and the containers inside them are copied (aliases
    kept: an object reached twice is copied once); tensors, the objects whose ids are in
    ``shared`` and everything else are shared.
    """
    copies: dict[int, Any] = {}

    def convert(item: Any) -> Any:
        if id(item) in copies:
            return copies[id(item)]
        if id(item) in shared:
            return item
        if isinstance(item, list):
            copies[id(item)] = copied = []
            copied.extend(convert(x) for x in item)
            return copied
        if isinstance(item, tuple) and not hasattr(item, "_fields"):
            return type(item)(convert(x) for x in item)
        if type(item) is dict:
            copies[id(item)] = mapped = {}
            mapped.update((key, convert(x)) for key, x in item.items())
            return mapped
        if isinstance(item, types.FunctionType) and item.__closure__:
            copies[id(item)] = item  # a recursive closure refers to itself
            copies[id(item)] = RebuildFunction(item, 0)(*map(convert, closure_cells(item)))
            return copies[id(item)]
        if is_rebuildable_object(item):
            copies[id(item)] = instance = fresh_instance(type(item), {})
            vars(instance).update((key, convert(x)) for key, x in vars(item).items())
            return instance
        return example(item)

    return convert(value)


def state_after(obj: Any, *calls: Any) -> Any:
    """``obj`` itself: the node for an object as a leaf call left it. The call is an argument
    only so that every later read of the object runs after the call that changed it."""
    return obj


def read_state(obj: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in ``obj``'s state: list and tuple items by position, dict items
    by key, anything else by attribute (the paths :func:`copied_objects`' callers build)."""
    value = obj
    for step in path:
        if isinstance(value, (list, tuple)) or type(value) is dict:
            value = value[step]
        else:
            value = getattr(value, step)
    return value


def copied_objects(original: Any, copied: Any) -> list[tuple[Any, Any]]:
    """Each plain object in ``original`` (a call's arguments) with its copy in ``copied`` (the
    same arguments as :func:`example_copy` copied them): what a leaf call may have changed.
    Objects that were shared, not copied, are left out; so are objects inside closures."""
    pairs: list[tuple[Any, Any]] = []

    def walk(item: Any, copy: Any) -> None:
        if item is copy:
            return
        if is_rebuildable_object(item) and type(copy) is type(item):
            pairs.append((item, copy))
        elif isinstance(item, (list, tuple)) and isinstance(copy, (list, tuple)):
            for x, y in zip(item, copy):
                walk(x, y)
        elif type(item) is dict and type(copy) is dict:
            for key, x in item.items():
                if key in copy:
                    walk(x, copy[key])

    walk(original, copied)
    return pairs


def tensor_versions(value: Any) -> dict[int, int]:
    """The version counter of every tensor in an object's state, by id: an in-place write
    into one (a static cache's ``index_copy_``) changes its version, not its identity."""
    versions: dict[int, int] = {}
    visited: set[int] = set()

    def walk(item: Any) -> None:
        if id(item) in visited:
            return
        visited.add(id(item))
        if isinstance(item, torch.Tensor):
            if not item.is_inference():  # inference tensors keep no version
                versions[id(item)] = item._version
        elif isinstance(item, (list, tuple)):
            for x in item:
                walk(x)
        elif type(item) is dict:
            for x in item.values():
                walk(x)
        elif is_rebuildable_object(item):
            for x in vars(item).values():
                walk(x)

    walk(value)
    return versions


def state_fingerprint(value: Any) -> tuple[Any, ...]:
    """Identity of every leaf in an object's state, nested objects and containers included:
    equal fingerprints mean traced code changed nothing in it since it was last recorded."""
    parts: list[Any] = []
    visited: set[int] = set()

    def walk(item: Any) -> None:
        if id(item) in visited:
            parts.append(("seen", id(item)))
            return
        visited.add(id(item))
        if isinstance(item, (list, tuple)):
            parts.append((type(item), len(item)))
            for x in item:
                walk(x)
        elif type(item) is dict:
            parts.append((dict, tuple(item)))
            for x in item.values():
                walk(x)
        elif is_rebuildable_object(item):
            parts.append((type(item), tuple(vars(item))))
            for x in vars(item).values():
                walk(x)
        else:
            parts.append(id(item))

    walk(value)
    return tuple(parts)
