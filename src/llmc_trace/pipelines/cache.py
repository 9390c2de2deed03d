"""Intermediate values between subgraphs, one dict per batch, offloaded and de-duplicated.

Three things keep host memory in check. Consumed names are dropped as soon as no later
subgraph reads them, batch by batch. Values that do not depend on the sample's content (the
causal mask and the rotary cos/sin for a given shape) are stored once: the reference tool keeps
one copy per sample for the whole run, about 16 GiB of host memory for 512 samples of 4096
tokens. And a tensor that differs per batch lives in one contiguous *slab* (``[batches, ...]``)
instead of one allocation per batch: a subgraph's output takes over the slab of an input it
consumes, row by row as each batch's input is dropped, so a decoder layer's hidden states
replace its input's in place and the cache holds one set of hidden states, never two; and
whole slabs go back to the system when freed instead of leaving the heap fragmented by
thousands of batch-sized holes (on a GPU host the slab is pinned once, not per batch).

torch's pinned-memory allocator rounds every block up to a power of two, so a pinned slab of
520 batches of 16 MiB (8.1 GiB) would hold 16 GiB of host memory; and a freed pinned block
stays in torch's pinned cache, where the next slab of its size reuses it. A slab whose block
would waste more than :data:`PINNED_WASTE` of its size is kept in pageable memory instead
(its copies to the device then wait for the host); :func:`slab_host_bytes` says what a slab
holds, for the memory plan as for the cache.

Sharing is decided by exact equality, not by guessing from the graph: a value is compared with
the first batch's value of the same name (same shape and dtype); once a name is seen to differ
it is never compared again, so hidden states cost one comparison in the whole run.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.tracing.values import map_leaves


#: The most host memory a pinned slab may hold beyond its size, as a share of it.
PINNED_WASTE = 1 / 8


def pinned_block_bytes(nbytes: int) -> int:
    """The host memory torch's caching pinned-memory allocator holds for a block of
    ``nbytes``: the next power of two."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 1 else nbytes


def pins_slab(nbytes: int) -> bool:
    """Whether a slab of ``nbytes`` on a GPU host is pinned: where rounding its block up to a
    power of two wastes at most :data:`PINNED_WASTE` of it."""
    return pinned_block_bytes(nbytes) <= nbytes * (1 + PINNED_WASTE)


def slab_host_bytes(nbytes: int, for_gpu: bool) -> int:
    """The host memory a slab of ``nbytes`` holds: its pinned block's on a GPU host where it
    is pinned, else its size."""
    return pinned_block_bytes(nbytes) if for_gpu and pins_slab(nbytes) else nbytes


def move(value: Any, device: torch.device, pin: bool = False) -> Any:
    """Move every tensor inside ``value`` to ``device`` (containers, ModelOutputs and the
    fields of dataclass values kept; a dataclass whose tensors moved is a shallow copy)."""

    def convert(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device != device:
            moved = leaf.to(device, non_blocking=pin)
            return moved.pin_memory() if pin and device.type == "cpu" else moved
        if (
            dataclasses.is_dataclass(leaf)
            and not isinstance(leaf, type)
            and hasattr(leaf, "__dict__")
        ):
            # the instance's own state, not its attributes: properties may compute or raise
            state = vars(leaf)
            changed = {name: move(item, device, pin) for name, item in state.items()}
            if all(changed[name] is item for name, item in state.items()):
                return leaf
            copied = copy.copy(leaf)
            vars(copied).update(changed)
            return copied
        return leaf

    return map_leaves(convert, value)


def values_equal(a: Any, b: Any) -> bool:
    """Exact equality of two cached values: same structure, same tensors bit for bit."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b.to(a.device)))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    return a == b if isinstance(a, (int, float, str, bool, type(None))) else a is b


@dataclass
class _Slab:
    """Rows ``[i]`` of one tensor, one per batch; ``free`` counts rows released from the front."""

    tensor: torch.Tensor
    free: int = 0

    def fits(self, value: torch.Tensor) -> bool:
        return value.shape == self.tensor.shape[1:] and value.dtype == self.tensor.dtype

    def has_row(self, index: int) -> bool:
        """A slab has a row for each batch the cache held when it was made, not for batches
        appended after."""
        return index < len(self.tensor)


@dataclass
class IntermediatesCache:
    """``batches[i][name]`` holds the value ``name`` of batch ``i`` on ``offload_device``."""

    offload_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    batches: list[dict[str, Any]] = field(default_factory=list)
    #: the values are computed on a GPU: host copies are pinned, and a value stored outside a
    #: slab leaves the device without waiting for it; slab rows and fetches copy in step with
    #: the device (a CPU run pins nothing, GPU or not on the machine)
    for_gpu: bool = False
    _first: dict[str, Any] = field(default_factory=dict)
    _varies: set[str] = field(default_factory=set)
    _slabs: dict[str, _Slab] = field(default_factory=dict)
    _retiring: dict[str, _Slab] = field(default_factory=dict)  # consumed, rows being freed
    shared_names: set[str] = field(default_factory=set)

    @classmethod
    def from_batches(
        cls, batches: list[dict[str, Any]], offload_device: torch.device, *, for_gpu: bool = False
    ) -> IntermediatesCache:
        cache = cls(offload_device, [{} for _ in batches], for_gpu)
        for index, batch in enumerate(batches):
            cache._put(index, batch)
        return cache

    def __len__(self) -> int:
        return len(self.batches)

    def append(self, values: dict[str, Any]) -> int:
        """Store ``values`` as a new batch after the others; returns its index."""
        self.batches.append({})
        index = len(self.batches) - 1
        self._put(index, values)
        return index

    def fetch(
        self,
        index: int,
        names: list[str],
        device: torch.device,
        private: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """Values of batch ``index`` on ``device``; names in ``private`` are copied, because the
        subgraph writes into them in place and the cached value must not change."""
        values = {}
        for name in names:
            value = move(self.batches[index][name], device)
            if name in private:
                value = map_leaves(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, value)
            values[name] = value
        return values

    def replace(self, index: int, consumed_names: list[str], outputs: dict[str, Any]) -> None:
        """Record that batch ``index`` ran one subgraph: drop the ``consumed_names`` it read
        for the last time, then store its ``outputs``.

        One call, so the order cannot be wrong: dropped first, a consumed input's slab row is
        free for an output of the same shape to take (a decoder layer's hidden states replace
        its input's in place); stored first, the output would need memory of its own while the
        input is still held. Either list may be empty (a value given once, or only dropped).

        >>> cache = IntermediatesCache.from_batches([{"x": torch.zeros(2)}], torch.device("cpu"))
        >>> cache.replace(0, ["x"], {"y": torch.ones(2)})
        >>> sorted(cache.names())
        ['y']
        """
        self._drop(consumed_names, index)
        self._put(index, outputs)

    def _put(self, index: int, values: dict[str, Any]) -> None:
        """Store batch ``index``'s ``values``, each shared, in a slab row, or owned."""
        for name, value in values.items():
            stored = self._shared_copy(name, value)
            if stored is None:
                stored = self._store(name, index, value)
                if name not in self._first:
                    self._first[name] = stored
            self.batches[index][name] = stored

    def _shared_copy(self, name: str, value: Any) -> Any | None:
        if name in self._varies or name not in self._first:
            return None
        if values_equal(value, self._first[name]):
            self.shared_names.add(name)
            return self._first[name]
        self._varies.add(name)
        return None

    def _store(self, name: str, index: int, value: Any) -> Any:
        """``value`` on the offload device: in a slab row when it is a per-batch tensor."""
        if not isinstance(value, torch.Tensor):
            return self._owned(move(value, self.offload_device, self._pin))
        slab = self._slabs.get(name) or self._slab_for(name, index, value)
        if slab is None or not slab.fits(value) or not slab.has_row(index):
            return self._owned(move(value, self.offload_device, self._pin))
        row = slab.tensor[index]
        if self._row_taken(index, name, row):
            return self._owned(move(value, self.offload_device, self._pin))
        if value.untyped_storage().data_ptr() == row.untyped_storage().data_ptr():
            value = value.clone()  # a view of the row it is about to overwrite
        row.copy_(value)
        return row

    def _row_taken(self, index: int, name: str, row: torch.Tensor) -> bool:
        """Does another value of batch ``index`` still live in ``row``? A slab taken over
        assumes each batch drops its consumed inputs before storing its outputs (as
        :meth:`replace` does); a caller that stores first (llm-compressor's order, through
        :mod:`llmc_trace.compat.cache`) must not overwrite the input it still holds."""
        if row.device.type == "meta":
            return False  # a meta row holds no data to overwrite
        return any(
            other != name and isinstance(value, torch.Tensor) and value.data_ptr() == row.data_ptr()
            for other, value in self.batches[index].items()
        )

    def _slab_for(self, name: str, index: int, value: torch.Tensor) -> _Slab | None:
        """Adopt a retiring slab whose rows up to ``index`` are free, or start a new slab once
        ``name`` is known to differ between batches (its earlier rows are copied in)."""
        for old, slab in list(self._retiring.items()):
            if slab.fits(value) and slab.free > index and slab.has_row(index):
                del self._retiring[old]
                self._slabs[name] = slab
                return slab
        if name not in self._varies or index == 0:
            return None
        earlier = [self.batches[i].get(name) for i in range(index)]
        if not all(isinstance(t, torch.Tensor) and t.shape == value.shape for t in earlier):
            return None
        shape = (len(self.batches), *value.shape)
        nbytes = value.element_size() * value.numel() * len(self.batches)
        tensor = torch.empty(
            shape,
            dtype=value.dtype,
            device=self.offload_device,
            pin_memory=self._pin and pins_slab(nbytes),
        )
        slab = self._slabs[name] = _Slab(tensor)
        for i, previous in enumerate(earlier):
            tensor[i].copy_(previous)
            self.batches[i][name] = tensor[i]
        self._first[name] = tensor[0]
        return slab

    def _owned(self, value: Any) -> Any:
        """``value`` itself unless it aliases a slab row, which a later batch may overwrite."""
        storages = {s.tensor.untyped_storage().data_ptr() for s in self._all_slabs()}

        def own(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr() in storages:
                return leaf.clone()
            return leaf

        return map_leaves(own, value) if storages else value

    def _all_slabs(self) -> list[_Slab]:
        return [*self._slabs.values(), *self._retiring.values()]

    @property
    def _pin(self) -> bool:
        return self.offload_device.type == "cpu" and self.for_gpu

    def _drop(self, names: list[str], index: int) -> None:
        """Drop ``names`` from batch ``index``.

        Dropping batch by batch (in batch order) frees a slab's rows from the front: an output
        stored for the same batch may take the slab over."""
        for name in names:
            self.batches[index].pop(name, None)
        last = index == len(self.batches) - 1
        for name in names:
            if name in self._slabs and not last:
                self._retiring[name] = self._slabs.pop(name)
            if name in self._retiring:
                self._retiring[name].free = index + 1
                if last:
                    del self._retiring[name]
            if last:
                self._slabs.pop(name, None)
                self._first.pop(name, None)
                self._varies.discard(name)  # a name stored again is compared afresh

    def names(self) -> set[str]:
        return {name for batch in self.batches for name in batch}

    def size_bytes(self) -> int:
        """Bytes held: every slab whole (its free rows included), each shared value once."""
        seen: set[int] = set()
        total = 0
        for slab in self._all_slabs():
            seen.add(slab.tensor.untyped_storage().data_ptr())
            total += slab.tensor.numel() * slab.tensor.element_size()
        for batch in self.batches:
            for value in batch.values():

                def visit(leaf: Any) -> Any:
                    nonlocal total
                    if isinstance(leaf, torch.Tensor):
                        pointer = leaf.untyped_storage().data_ptr()
                        if pointer not in seen:
                            seen.add(pointer)
                            total += leaf.numel() * leaf.element_size()
                    return leaf

                map_leaves(visit, value)
        return total
