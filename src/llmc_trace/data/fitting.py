"""Fit one preprocessed sample to `seq_len` without cutting a media item's tokens in half.

A processor expands each image into a run of placeholder tokens whose count must equal the
vision tower's embeddings for that image: cutting the run (as plain truncation at `seq_len`
would) makes the model's forward fail, or worse, misplace the embeddings. So a long sample
loses *text*: the last ordinary tokens go first (the end of the answer), while placeholder
tokens, special tokens (chat-turn markers, begin/end-of-image, Idefics3's tile tags) and a
lone ordinary token between two of them (the newline between Idefics3's tile rows) stay.
Removing the same positions from every per-token tensor keeps them consistent (Qwen2-VL's
`mm_token_type_ids`, Gemma 3's `token_type_ids`), so the model sees a shorter text with whole
images.

A sample whose protected tokens alone exceed `seq_len` cannot fit: it is dropped and counted
by the caller (which refuses the data only when too few rows fit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenFit:
    """The positions of a sample kept (`keep`, ascending) and the token ids there.

    `shortened` is whether any text was removed.
    """

    keep: torch.Tensor
    input_ids: torch.Tensor
    shortened: bool


def protected_mask(input_ids: torch.Tensor, protected_ids: Sequence[int]) -> torch.Tensor:
    """Positions of `input_ids` (1-D) that must stay: `protected_ids`, and a single ordinary
    token with protected tokens on both sides."""
    protected = torch.isin(input_ids, torch.tensor(list(protected_ids), dtype=input_ids.dtype))
    between = torch.zeros_like(protected)
    between[1:-1] = protected[:-2] & protected[2:] & ~protected[1:-1]
    return protected | between


def fit_tokens(
    input_ids: torch.Tensor,
    protected: torch.Tensor,
    placeholders: torch.Tensor,
    *,
    seq_len: int,
) -> TokenFit | None:
    """Keep at most `seq_len` positions of `input_ids`, dropping unprotected ones from the end.

    `protected` and `placeholders` are boolean masks over `input_ids` (1-D). Returns None when
    the protected positions (the placeholders among them) alone exceed `seq_len`.
    """
    length = int(input_ids.shape[0])
    positions = torch.arange(length)
    if length <= seq_len:
        return TokenFit(keep=positions, input_ids=input_ids, shortened=False)
    if int(placeholders.sum()) > seq_len:
        return None
    excess = length - seq_len
    free = positions[~protected]
    if free.numel() < excess:
        return None
    drop = free[free.numel() - excess :]
    keep = positions[~torch.isin(positions, drop)]
    return TokenFit(keep=keep, input_ids=input_ids[keep], shortened=True)
