"""Write safetensors shards tensor by tensor, in any order, holding none of them.

Every tensor's name, dtype and shape is known before the first one exists (they follow from
the model and the scheme), so each shard's header can be written first and the file sized to
its final length; a tensor then goes straight to its offset when it is ready (``os.pwrite``)
and nothing waits in memory for the rest of its shard. Shards follow the order the tensors
were planned in (the model's order, which is the order a sequential pipeline finishes them),
``max_shard_size`` bytes of tensor data each at most (a single larger tensor gets a shard of
its own), named and indexed as transformers names and indexes them: one shard is
``model.safetensors``; several are ``model-0000i-of-0000n.safetensors`` with
``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from llmc_trace.core.names import DEFAULT_MAX_SHARD_SIZE
from llmc_trace.core.sizes import TensorSpec
from llmc_trace.errors import CheckpointError
from llmc_trace.models.weight_store import SAFETENSORS_DTYPES

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
"""5 GB, the shard size transformers' ``save_pretrained`` uses by default."""

_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


@dataclass(frozen=True)
class _Place:
    shard: int
    offset: int  # absolute, in the shard's file
    spec: TensorSpec


class ShardedSafetensors:
    """The shards of one checkpoint folder, their headers written at construction."""

    def __init__(
        self,
        folder: Path,
        specs: Mapping[str, TensorSpec],
        max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
        *,
        written: Collection[str] = (),
    ) -> None:
        """``written``: tensors already in the folder's shards, left by an interrupted run
        that planned the same tensors (its shards are reopened, not emptied)."""
        groups: list[list[str]] = [[]]
        filled = 0
        for name, spec in specs.items():
            if groups[-1] and filled + spec.nbytes > max_shard_size:
                groups.append([])
                filled = 0
            groups[-1].append(name)
            filled += spec.nbytes
        count = len(groups)
        self.files = [
            folder
            / (SINGLE_NAME if count == 1 else f"model-{i + 1:05d}-of-{count:05d}.safetensors")
            for i in range(count)
        ]
        self._places: dict[str, _Place] = {}
        self._fds: list[int] = []
        for number, (path, names) in enumerate(zip(self.files, groups)):
            header: dict[str, object] = {"__metadata__": {"format": "pt"}}
            offset = 0
            for name in names:
                spec = specs[name]
                header[name] = {
                    "dtype": _NAMES[spec.dtype],
                    "shape": list(spec.shape),
                    "data_offsets": [offset, offset + spec.nbytes],
                }
                offset += spec.nbytes
            encoded = json.dumps(header, separators=(",", ":")).encode()
            encoded += b" " * (-len(encoded) % 8)  # data starts 8-byte aligned
            start = 8 + len(encoded)
            if written and (not path.is_file() or path.stat().st_size != start + offset):
                raise CheckpointError(
                    "the interrupted run's shard is missing or has another size.",
                    hint="pass --overwrite to start the run afresh.",
                    location=str(path),
                )
            fd = os.open(path, os.O_RDWR | os.O_CREAT | (0 if written else os.O_TRUNC), 0o644)
            self._fds.append(fd)
            os.pwrite(fd, len(encoded).to_bytes(8, "little") + encoded, 0)
            os.ftruncate(fd, start + offset)
            for name in names:
                place_offset = start + int(header[name]["data_offsets"][0])  # type: ignore[index]
                self._places[name] = _Place(number, place_offset, specs[name])
        self._weight_map = {name: self.files[p.shard].name for name, p in self._places.items()}
        self._missing = set(self._places) - set(written)

    def written(self) -> list[str]:
        """The tensors written so far, in planned order."""
        return [name for name in self._places if name not in self._missing]

    def sync(self) -> None:
        """Flush what was written to disk, so that a resume point naming it outlives a
        lost machine, not only a killed process."""
        for fd in self._fds:
            os.fsync(fd)

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` at its place; its dtype and shape must be the planned ones."""
        place = self._places.get(name)
        if place is None:
            raise CheckpointError("this tensor was not planned for the checkpoint.", location=name)
        if name not in self._missing:
            raise CheckpointError("this tensor was already written.", location=name)
        spec = TensorSpec(tensor.dtype, tuple(tensor.shape))
        if spec != place.spec:
            raise CheckpointError(
                f"planned as {place.spec.dtype} {place.spec.shape}, got {spec.dtype} {spec.shape}.",
                hint="the model changed after the checkpoint was planned.",
                location=name,
            )
        data = memoryview(
            tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        )
        done = 0
        while done < len(data):  # one write moves at most about 2 GiB on Linux
            done += os.pwrite(self._fds[place.shard], data[done:], place.offset + done)
        self._missing.discard(name)

    def close(self) -> list[Path]:
        """Flush every shard, write the index when there are several; every planned tensor
        must have been written."""
        if self._missing:
            missing = sorted(self._missing)
            raise CheckpointError(
                f"{len(missing)} planned tensor(s) were never written "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}).",
                hint="the pipeline did not finish every module; nothing was saved.",
            )
        self.sync()
        self.abandon()
        if len(self.files) > 1:
            total = sum(p.spec.nbytes for p in self._places.values())
            index = {"metadata": {"total_size": total}, "weight_map": self._weight_map}
            (self.files[0].parent / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return list(self.files)

    def abandon(self) -> None:
        """Close the files without checking (the caller removes the folder)."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
