"""``compress``: calibrate a model and write a compressed-tensors checkpoint."""

from llmc_trace.oneshot.compressor import LayerCompressor, LayerResult
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.run import CompressionResult, compress
from llmc_trace.oneshot.stage import Stage, parse_sparsity

__all__ = [
    "CompressRequest",
    "CompressionResult",
    "LayerCompressor",
    "LayerResult",
    "Stage",
    "compress",
    "parse_sparsity",
]
