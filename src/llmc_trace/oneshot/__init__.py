"""``compress``: calibrate a model and write a compressed-tensors checkpoint.

Names are imported when first used (PEP 562): the command line reads the option declarations
(:mod:`~llmc_trace.oneshot.settings`) without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CompressRequest": "llmc_trace.oneshot.request",
    "CompressionResult": "llmc_trace.oneshot.result",
    "LayerCompressor": "llmc_trace.oneshot.compressor",
    "LayerResult": "llmc_trace.oneshot.compressor",
    "Stage": "llmc_trace.oneshot.stage",
    "compress": "llmc_trace.oneshot.run",
    "parse_sparsity": "llmc_trace.oneshot.stage",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'llmc_trace.oneshot' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return __all__
