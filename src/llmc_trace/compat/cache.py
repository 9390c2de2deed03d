"""llm-compressor's ``IntermediatesCache`` API over llmc-trace's intermediates cache.

The names and parameters are those of ``llmcompressor.pipelines.cache.IntermediatesCache``
(0.14); the storage is :class:`llmc_trace.pipelines.cache.IntermediatesCache`, so values equal
in every batch (the causal mask, rotary tables) are stored once and per-batch tensors live in
slabs. :mod:`llmc_trace.compat` lists where the behaviour differs and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import torch

from llmc_trace.errors import BadInputError
from llmc_trace.pipelines.cache import IntermediatesCache as LlmcCache

Device = torch.device | str


class IntermediatesCache:
    """Values (activations) of each batch between subgraphs, kept on ``offload_device`` and
    fetched onto the device they came from (values given by a dataloader: ``model_device``).

    ``model_device`` (keyword-only here) is where the batches given at construction are
    fetched onto; ``offload_device=None`` keeps values on it (the CPU when there is none).
    ``intermediates`` is the llmc-trace cache underneath, for its extras (``size_bytes``,
    ``shared_names``). Build one with :meth:`from_dataloader`, :meth:`empty` or from a list of
    batches (dicts of values), as in llm-compressor::

        cache = IntermediatesCache.from_dataloader(batches, model_device="cpu")
        for batch_index in range(len(cache)):
            outputs = subgraph.forward(model, **cache.fetch(batch_index, subgraph.input_names))
            cache.update(batch_index, outputs)
            cache.delete(batch_index, subgraph.consumed_names)
    """

    def __init__(
        self,
        batch_intermediates: Iterable[Mapping[str, Any]] | None = None,
        offload_device: Device | None = "cpu",
        *,
        model_device: Device | None = None,
    ) -> None:
        self.offload_device = None if offload_device is None else torch.device(offload_device)
        onload = None if model_device is None else torch.device(model_device)
        batches = [_as_batch(values) for values in batch_intermediates or []]
        self._onload_devices = [
            {name: onload or _device_of(value) for name, value in batch.items()}
            for batch in batches
        ]
        storage = self.offload_device or onload or torch.device("cpu")
        self.intermediates = LlmcCache.from_batches(batches, storage)

    @property
    def batch_intermediates(self) -> list[dict[str, Any]]:
        """Each batch's values as stored (offloaded): the values themselves, where
        llm-compressor keeps ``IntermediateValue`` records of value and device."""
        return self.intermediates.batches

    @classmethod
    def empty(cls, num_batches: int, offload_device: Device | None) -> IntermediatesCache:
        """A cache of ``num_batches`` batches holding nothing yet."""
        return cls([{} for _ in range(num_batches)], offload_device)

    @classmethod
    def from_dataloader(
        cls,
        dataloader: Iterable[Mapping[str, Any]],
        model_device: Device = "cpu",
        offload_device: Device | None = "cpu",
    ) -> IntermediatesCache:
        """Every batch of ``dataloader`` (each a dict of model inputs), offloaded; fetched
        values land on ``model_device``."""
        return cls(dataloader, offload_device, model_device=model_device)

    def fetch(self, batch_index: int, input_names: Collection[str] | None = None) -> dict[str, Any]:
        """The values of batch ``batch_index`` named in ``input_names`` (all when ``None``) that
        the batch holds, each on the device it came from and a copy the caller owns."""
        stored = self.intermediates.batches[batch_index]
        return {
            name: self._onload(batch_index, name)
            for name in stored
            if input_names is None or name in input_names
        }

    def _onload(self, batch_index: int, name: str) -> Any:
        storage = self.intermediates.offload_device
        device = self._onload_devices[batch_index][name] or storage
        # a value fetched where it is stored would be the cached tensor itself: one shared by
        # all batches, or a slab row a later output may take over; the caller gets a copy
        private = frozenset([name]) if device == storage else frozenset()
        return self.intermediates.fetch(batch_index, [name], device, private)[name]

    def update(self, batch_index: int, values: Mapping[str, Any]) -> None:
        """Store ``values`` for batch ``batch_index`` (replacing values of the same name)."""
        for name, value in values.items():
            self._onload_devices[batch_index][name] = _device_of(value)
        self.intermediates.replace(batch_index, [], dict(values))

    def append(self, values: Mapping[str, Any]) -> None:
        """Store ``values`` as a new batch after the others."""
        self._onload_devices.append({name: _device_of(value) for name, value in values.items()})
        self.intermediates.append(dict(values))

    def delete(self, batch_index: int, consumed_names: Collection[str] | None = None) -> None:
        """Drop ``consumed_names`` (every value when ``None``) from batch ``batch_index``."""
        stored = self.intermediates.batches[batch_index]
        names = list(stored) if consumed_names is None else list(consumed_names)
        missing = [name for name in names if name not in stored]
        if missing:
            raise BadInputError(
                f"Batch {batch_index} holds no value named {', '.join(map(repr, missing))}.",
                hint="Delete each name once, after its last reader has run "
                "(Subgraph.consumed_names says when).",
                param="consumed_names",
            )
        self.intermediates.replace(batch_index, names, {})
        for name in names:
            del self._onload_devices[batch_index][name]

    def iter(self, input_names: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
        """:meth:`fetch` of every batch in turn."""
        for batch_index in range(len(self)):
            yield self.fetch(batch_index, input_names)

    def iter_prefetch(self, input_names: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
        """The batches of :meth:`iter`, fetched in turn: there is no background thread here, and
        on a GPU host the slabs are pinned once, so each copy to the device is already fast."""
        return self.iter(input_names)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter()

    def __len__(self) -> int:
        return len(self.intermediates)


def _as_batch(values: Any) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise BadInputError(
            f"A batch must map input names to values; got {type(values).__name__}.",
            hint="Yield dicts from the dataloader, e.g. {'input_ids': ..., 'attention_mask': ...}.",
            param="dataloader",
        )
    return dict(values)


def _device_of(value: Any) -> torch.device | None:
    """The device of the first tensor inside ``value`` (containers and dataclass fields
    searched), or ``None`` when it holds no tensor: where the value goes back to on fetch."""
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = vars(value).values() if hasattr(value, "__dict__") else ()
    else:
        return None
    return next((d for d in map(_device_of, items) if d is not None), None)
