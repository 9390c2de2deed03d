"""Write compressed models as compressed-tensors checkpoints that vLLM and transformers load."""

from llmc_trace.checkpoint.pack import pack_to_int32, unpack_from_int32
from llmc_trace.checkpoint.recipe import Recipe, render_recipe
from llmc_trace.checkpoint.writer import SparsityInfo, save_compressed

__all__ = [
    "Recipe",
    "SparsityInfo",
    "pack_to_int32",
    "render_recipe",
    "save_compressed",
    "unpack_from_int32",
]
