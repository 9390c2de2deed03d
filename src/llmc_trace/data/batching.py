"""Group samples into right-padded batches with attention masks.

Right padding keeps every real token at the position it would have alone, so with a causal model
the logits of real tokens do not depend on the padding (the mask hides it from attention), and
calibration statistics gathered on them match unbatched runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_batches(
    samples: Sequence[Sequence[int]], *, batch_size: int, pad_id: int
) -> list[dict[str, torch.Tensor]]:
    """Batch `samples` in order, each batch padded on the right to its longest sample.

    Each batch is `{"input_ids": (B, T) long, "attention_mask": (B, T) long}` with 1 on real
    tokens and 0 on padding; only the last batch may hold fewer than `batch_size` samples.
    Padding to the longest sample of a batch, not to `seq_len`, spares work on short texts.
    """
    batches = []
    for first in range(0, len(samples), batch_size):
        chunk = samples[first : first + batch_size]
        width = max(len(sample) for sample in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, sample in enumerate(chunk):
            input_ids[row, : len(sample)] = torch.as_tensor(sample, dtype=torch.long)
            attention_mask[row, : len(sample)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask})
    return batches
