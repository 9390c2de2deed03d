"""Decide which dimensions of a traced value depend on tensor data, by moving those sizes.

A size read from tensor data (the token count a vision tower returns for an image grid, the
rows ``nonzero`` finds) makes every shape computed *from that size* data-dependent, and only
those: ``inputs_embeds.masked_scatter(mask, image_embeds)`` takes the image rows from a
data-dependent count, yet its result always has ``inputs_embeds``' shape. Marking every result
of such an input data-dependent sends tracing down a false failure at the first ``if`` on a
shape computed from it (Qwen2.5-VL's ``position_ids.shape[0] == 4``, issue 38).

The rule, per operation: give each data-dependent dimension of each input a sentinel size
(the same size gets the same sentinel everywhere, as one symbol would), derive the result's
shape again on ``meta``, and call data-dependent exactly the result dimensions that moved. An
operation ``meta`` cannot run on the sentinels (sizes that no longer agree, values read) is
taken as data-dependent in every dimension: the rule only ever clears what it proved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from llmc_trace.tracing.values import META, META_MEMO, map_leaves

#: Added to a data-dependent size to make its sentinel: far from any size a model derives from
#: its config, prime so that no product or quotient of real sizes lands on it by chance.
SENTINEL_OFFSET = 7919

#: Per tensor leaf of a value (in :func:`~llmc_trace.tracing.values.map_leaves` order), the
#: dimensions whose size depends on tensor data; ``None``: not known, so every dimension of
#: every leaf is taken to.
DynamicDims = tuple[tuple[int, ...], ...] | None


def every_dimension(value: Any) -> tuple[tuple[int, ...], ...]:
    """Every dimension of every tensor in ``value``: what an unknown answer stands for."""
    return tuple(tuple(range(leaf.dim())) for leaf in _tensor_leaves(value))


def with_sentinels(value: Any, dims: DynamicDims) -> Any:
    """``value`` with each tensor a fresh ``meta`` tensor whose data-dependent sizes are moved
    to their sentinels (fresh, so an in-place operation run on it changes no example)."""
    leaves = _tensor_leaves(value)
    moved = dims if dims is not None and len(dims) == len(leaves) else every_dimension(value)
    by_leaf = {id(leaf): set(leaf_dims) for leaf, leaf_dims in zip(leaves, moved)}

    def convert(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        shape = [
            size + SENTINEL_OFFSET if dim in by_leaf.get(id(leaf), ()) else size
            for dim, size in enumerate(leaf.shape)
        ]
        return torch.empty(shape, dtype=leaf.dtype, device=META)

    return map_leaves(convert, value)


def fresh_meta(value: Any) -> Any:
    """``value`` with each tensor a fresh ``meta`` tensor of the same shape."""
    return with_sentinels(value, tuple(() for _ in _tensor_leaves(value)))


def moved_dimensions(
    run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], example: Any
) -> DynamicDims:
    """The dimensions of ``run``'s result that moved from ``example``'s when run on ``args``
    (which hold sentinel sizes); ``None`` when ``meta`` cannot run it or the result's structure
    changed (then nothing is proved)."""
    try:
        with META_MEMO:
            result = run(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure only means: not proved independent
        return None
    got, want = _shapes(result), _shapes(example)
    if got is None or want is None or len(got) != len(want):
        return None
    moved = []
    for new, old in zip(got, want):
        if len(new) != len(old):
            return None
        moved.append(tuple(dim for dim, (a, b) in enumerate(zip(new, old)) if a != b))
    return tuple(moved)


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def visit(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            found.append(leaf)
        return leaf

    map_leaves(visit, value)
    return found


def _shapes(value: Any) -> list[tuple[int, ...]] | None:
    """Shapes of the tensors in ``value``, in the order :func:`with_sentinels` visits them;
    ``None`` when a size is not a plain integer."""
    shapes = []
    for leaf in _tensor_leaves(value):
        if not all(isinstance(size, int) for size in leaf.shape):
            return None
        shapes.append(tuple(leaf.shape))
    return shapes
