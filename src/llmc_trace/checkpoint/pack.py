"""Pack b-bit integers into int32 words, and back, in compressed-tensors' `pack-quantized` layout.

The layout: each value q in [-2^(b-1), 2^(b-1) - 1] is stored as the unsigned q + 2^(b-1);
along the packed dimension, element i occupies bits [i*b, i*b + b) of a little-endian bit
stream, so 32 elements fill exactly b words with no padding between words, and only the end of
each row is padded up to a multiple of 32 elements. Words are stored as signed int32. Weights
are packed along their input dimension (dim 1); asymmetric zero points (out, groups) along their
output dimension (dim 0). For example the 4-bit row [-8, -7, 0, 1, 2, 3, 4, 7] is the single
word 0xFCBA9810 (element 0 in the lowest nibble).

The bit twiddling is compressed-tensors' own (`pack_to_int32`, `unpack_from_int32`): it is the
format's reference, and vLLM reads what it writes. These wrappers add the range check it leaves
out (an out-of-range value would silently spill into its neighbour's bits).
"""

from __future__ import annotations

from typing import Literal

import torch
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32 as _ct_pack_to_int32,
)
from compressed_tensors.compressors.pack_quantized.helpers import (
    unpack_from_int32 as _ct_unpack_from_int32,
)


def pack_to_int32(q: torch.Tensor, num_bits: int, packed_dim: Literal[0, 1] = 1) -> torch.Tensor:
    """Pack the integers `q` (2-D, any integer dtype) of width `num_bits` into int32 words.

    The result has ceil(n * num_bits / 32) words along `packed_dim`, where n is `q`'s size there.

    >>> hex(pack_to_int32(torch.tensor([[-8, -7, 0, 1, 2, 3, 4, 7]]), 4).item() & 0xFFFFFFFF)
    '0xfcba9810'
    """
    lowest, highest = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    if q.numel() and (q.min().item() < lowest or q.max().item() > highest):
        raise ValueError(
            f"values in [{q.min().item()}, {q.max().item()}] do not fit in {num_bits} bits "
            f"([{lowest}, {highest}])"
        )
    return _ct_pack_to_int32(q.to(torch.int8), num_bits, packed_dim)


def unpack_from_int32(
    packed: torch.Tensor,
    num_bits: int,
    shape: tuple[int, int] | torch.Size,
    packed_dim: Literal[0, 1] = 1,
) -> torch.Tensor:
    """Recover the int8 integers of `shape` that `pack_to_int32` packed into `packed`."""
    return _ct_unpack_from_int32(packed, num_bits, torch.Size(shape), packed_dim)
