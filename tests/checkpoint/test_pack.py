"""int32 packing: the reference words, and an independent bit-stream packer."""

from __future__ import annotations

import pytest
import torch

from llmc_trace.checkpoint import pack_to_int32, unpack_from_int32


def reference_pack(rows: list[list[int]], num_bits: int) -> list[list[int]]:
    """The layout written out longhand: value + 2^(b-1), element i at bits [i*b, i*b + b)
    of a little-endian bit stream, cut into 32-bit words, each stored as signed int32."""
    packed = []
    for row in rows:
        stream = 0
        for i, value in enumerate(row):
            stream |= (value + (1 << (num_bits - 1))) << (i * num_bits)
        words = -(-len(row) * num_bits // 32)
        unsigned = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(words)]
        packed.append([u - (1 << 32) if u >= 1 << 31 else u for u in unsigned])
    return packed


def test_reference_words() -> None:
    four = pack_to_int32(torch.tensor([[-8, -7, 0, 1, 2, 3, 4, 7]]), 4)
    assert four.dtype == torch.int32 and four.tolist() == [[0xFCBA9810 - (1 << 32)]]
    eight = pack_to_int32(torch.tensor([[-128, -1, 0, 127]]), 8)
    assert eight.tolist() == [[0xFF807F00 - (1 << 32)]]


@pytest.mark.parametrize("num_bits", range(2, 9))
@pytest.mark.parametrize("columns", [32, 45, 96])
def test_packing_matches_the_longhand_layout_and_round_trips(num_bits: int, columns: int) -> None:
    generator = torch.Generator().manual_seed(num_bits * 100 + columns)
    low, high = -(1 << (num_bits - 1)), 1 << (num_bits - 1)
    q = torch.randint(low, high, (5, columns), generator=generator, dtype=torch.int8)

    packed = pack_to_int32(q, num_bits)
    assert packed.tolist() == reference_pack(q.tolist(), num_bits)
    assert torch.equal(unpack_from_int32(packed, num_bits, q.shape), q)

    along_rows = pack_to_int32(q.T.contiguous(), num_bits, packed_dim=0)
    assert along_rows.T.tolist() == reference_pack(q.tolist(), num_bits)
    assert torch.equal(unpack_from_int32(along_rows, num_bits, q.T.shape, packed_dim=0), q.T)


def test_out_of_range_values_are_refused() -> None:
    with pytest.raises(ValueError, match="4 bits"):
        pack_to_int32(torch.tensor([[8, 0]]), 4)
