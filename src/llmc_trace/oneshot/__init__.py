"""``compress``: calibrate a model and write a compressed-tensors checkpoint.

Names are imported when first used (PEP 562): the command line reads the option declarations
(:mod:`~llmc_trace.spec.settings`) without importing torch.
"""

from __future__ import annotations

from llmc_trace.core.lazy import lazy_attributes

_WHERE = {
    "CompressRequest": "llmc_trace.oneshot.request",
    "CompressionResult": "llmc_trace.oneshot.result",
    "LayerCompressor": "llmc_trace.calibrate.compressor",
    "LayerResult": "llmc_trace.calibrate.solve",
    "Stage": "llmc_trace.spec.stage",
    "compress": "llmc_trace.oneshot.driver",
    "parse_sparsity": "llmc_trace.spec.stage",
    "validate": "llmc_trace.oneshot.request",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes("llmc_trace.oneshot", _WHERE)
