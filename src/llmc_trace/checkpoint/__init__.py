"""Write compressed models as compressed-tensors checkpoints that vLLM and transformers load."""

from llmc_trace.checkpoint.pack import pack_to_int32, unpack_from_int32
from llmc_trace.checkpoint.writer import SparsityInfo, save_compressed

__all__ = [
    "SparsityInfo",
    "pack_to_int32",
    "save_compressed",
    "unpack_from_int32",
]
