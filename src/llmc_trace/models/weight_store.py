"""``WeightStore``: a checkpoint's tensors, read from its safetensors files only when asked.

A 70B checkpoint is 140 GB; compressing it must never hold it. The store knows every tensor's
file, offset, dtype and shape from the headers alone (single ``model.safetensors`` and sharded
folders alike), and :meth:`WeightStore.read` reads each requested tensor's bytes straight into
a tensor of its own (``os.preadv``), one at a time. Not through a memory map: every page
touched through a mapping counts in the process's resident set for as long as the mapping
lives, so reading a group of tensors through one costs their bytes twice (the mapped pages and
the copy), and a mapping kept open grows to the model's size. Read this way, the only copy is
the tensor itself; the file's pages stay in the kernel's page cache, which is not ours.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from llmc_trace.core.sizes import TensorSpec
from llmc_trace.errors import BadInputError
from llmc_trace.models.weights import check_weight_files, missing_tensors

#: safetensors' dtype names, as written in the headers.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class StoredTensor(TensorSpec):
    """What one tensor is and where it lives, from its file's header."""

    file: Path = Path()
    offset: int = 0  # of its first byte in the file


class WeightStore:
    """Every tensor of a checkpoint folder, by name; nothing read until :meth:`read`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors: dict[str, StoredTensor] = {}
        for path in check_weight_files(folder):  # every header is known to parse
            with path.open("rb") as file:
                length = int.from_bytes(file.read(8), "little")
                header = json.loads(file.read(length))
            header.pop("__metadata__", None)
            for name, entry in header.items():
                self.tensors[name] = StoredTensor(
                    SAFETENSORS_DTYPES[entry["dtype"]],
                    tuple(entry["shape"]),
                    file=path,
                    offset=8 + length + entry["data_offsets"][0],
                )

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def read(
        self,
        names: Iterable[str],
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        """The tensors ``names``, as fresh tensors on ``device`` (floating ones cast to ``dtype``
        when given), read one at a time (see the module docstring)."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        out: dict[str, torch.Tensor] = {}
        for path, wanted in by_file.items():
            fd = os.open(path, os.O_RDONLY)
            try:
                for name in wanted:
                    tensor = _read(fd, self.tensors[name], name)
                    if dtype is not None and tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    out[name] = tensor.to(device)
            finally:
                os.close(fd)
        return out


def _read(fd: int, stored: StoredTensor, name: str) -> torch.Tensor:
    """One tensor's bytes from ``fd`` into a new CPU tensor."""
    tensor = torch.empty(stored.shape, dtype=stored.dtype)
    buffer = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    done = 0
    while done < stored.nbytes:  # one read moves at most about 2 GiB on Linux
        count = os.preadv(fd, [buffer[done:]], stored.offset + done)
        if count == 0:
            raise OSError(f"{stored.file} ends inside tensor {name}")
        done += count
    return tensor


def stored_names(model: torch.nn.Module, store: WeightStore) -> dict[str, str]:
    """For each parameter of ``model`` (under its first name), the name ``store`` holds it
    under (a tied parameter may be saved under any of its names); raises
    :class:`~llmc_trace.errors.BadInputError` for a tensor the files lack or shape otherwise."""
    aliases: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
        shapes[id(param)] = tuple(param.shape)
    found: dict[str, str] = {}
    missing: list[str] = []
    for identity, names in aliases.items():
        stored = next((name for name in names if name in store), None)
        if stored is None:
            missing.append(names[0])
            continue
        if store.tensors[stored].shape != shapes[identity]:
            raise BadInputError(
                f"The weights in {store.folder} do not fit its config: {stored} is "
                f"{store.tensors[stored].shape} in the file, {shapes[identity]} by the config.",
                hint="Every tensor must have the shape its config.json implies: check that the "
                "weights and config.json come from the same checkpoint.",
                param="model",
            )
        found[names[0]] = stored
    if missing:
        raise missing_tensors(store.folder, sorted(missing))
    return found
