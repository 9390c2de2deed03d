"""``compress``: calibrate a model and write a compressed-tensors checkpoint.

Names are imported when first used (PEP 562): the command line reads the option declarations
(:mod:`~llmc_trace.oneshot.settings`) without importing torch.
"""

from __future__ import annotations

from llmc_trace.core.lazy import lazy_attributes

_WHERE = {
    "CompressRequest": "llmc_trace.oneshot.request",
    "CompressionResult": "llmc_trace.oneshot.result",
    "LayerCompressor": "llmc_trace.oneshot.compressor",
    "LayerResult": "llmc_trace.oneshot.solve",
    "Stage": "llmc_trace.oneshot.stage",
    "compress": "llmc_trace.oneshot.run",
    "parse_sparsity": "llmc_trace.oneshot.stage",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes("llmc_trace.oneshot", _WHERE)
