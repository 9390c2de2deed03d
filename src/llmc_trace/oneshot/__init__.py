"""``compress``: calibrate a model and write a compressed-tensors checkpoint."""

from llmc_trace.oneshot.compressor import LayerCompressor, LayerResult
from llmc_trace.oneshot.request import CompressRequest, parse_sparsity
from llmc_trace.oneshot.run import CompressionResult, compress

__all__ = [
    "CompressRequest",
    "CompressionResult",
    "LayerCompressor",
    "LayerResult",
    "compress",
    "parse_sparsity",
]
