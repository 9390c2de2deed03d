"""Check a checkpoint folder's weight files before anything loads them.

A folder whose weights cannot become the model its ``config.json`` describes must be refused with
the reason, never half-loaded: transformers fills a tensor missing from the files with random
values and only logs it, and a truncated file fails deep inside the loader. Pickled weights
(``pytorch_model.bin``, ``*.pt``) are never loaded at all: unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from llmc_trace.core.finite import non_finite
from llmc_trace.errors import BadInputError

#: Weight files that are pickles; named in the refusal so the user knows what was found.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
INDEX_NAME = "model.safetensors.index.json"


def check_weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files, each with a readable header; raises for anything else.

    Reads headers only (the tensor data stays on disk): a shard index naming a missing shard, a
    truncated or corrupt file, and a folder holding only pickles are each refused, exit code 2.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        found = f"only pickled weights ({', '.join(pickles[:3])})" if pickles else "no weights"
        raise BadInputError(
            f"{folder} holds {found}: llmc-trace reads *.safetensors only"
            + (" (loading a pickle can run arbitrary code)." if pickles else "."),
            hint="Save the model with save_pretrained(folder) (safetensors is its default) "
            "where you trust the original files, and point --model at that folder.",
            param="model",
        )
    index = folder / INDEX_NAME
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError) as err:
            raise BadInputError(
                f"{index} is not a shard index ({err}).",
                hint="Re-save the checkpoint; the index maps every tensor name to its shard.",
                param="model",
            ) from err
        absent = sorted(name for name in shards if not (folder / name).exists())
        if absent:
            raise BadInputError(
                f"{folder} lacks {len(absent)} shard(s) its index names: {', '.join(absent[:3])}.",
                hint="Copy the missing shards; a checkpoint is only usable whole.",
                param="model",
            )
    for path in files:
        try:
            with safe_open(path, framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as err:
            raise BadInputError(
                f"{path} is not a readable safetensors file ({err}).",
                hint="It is truncated or corrupt: copy or download it again.",
                param="model",
            ) from err
    return files


def missing_tensors(folder: Path, missing: list[str]) -> BadInputError:
    """The refusal of a checkpoint that lacks tensors its config needs."""
    return BadInputError(
        f"{folder} lacks {len(missing)} tensor(s) its config.json needs "
        f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); loading it "
        "would fill them with random values.",
        hint="Re-save the checkpoint whole; a checkpoint is only usable complete.",
        param="model",
    )


def check_finite(folder: Path, name: str, tensor: torch.Tensor) -> None:
    """Refuse a checkpoint tensor holding NaN or inf, named, as it is read: one such value
    reaches every activation after it, and every Hessian and logit after those."""
    problem = non_finite(tensor)
    if problem is not None:
        raise BadInputError(
            f"the weights in {folder} are not finite: {name} holds {problem}.",
            hint="Restore the checkpoint from a good copy (a diverged run or a broken "
            "conversion writes NaN and inf); nothing was written.",
            param="model",
        )
