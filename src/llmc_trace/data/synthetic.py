"""Make random-token calibration batches for models built from configs with random weights.

A model made from a config alone (a tiny twin, or a zoo model checked for traceability) has no
trained tokenizer or data to go with it, yet pipelines and compressors still need inputs of the
right shape and vocabulary. Uniform random token ids serve: such a model's statistics carry no
meaning beyond exercising the code paths.
"""

from __future__ import annotations

import numpy as np

from llmc_trace.data.batching import pad_batches
from llmc_trace.data.calibration import CalibrationSet
from llmc_trace.errors import DataError
from llmc_trace.data.validation import check_sizes


def make_synthetic_text_batches(
    vocab_size: int, samples: int, seq_len: int, seed: int, *, batch_size: int = 1
) -> CalibrationSet:
    """Draw `samples` rows of `seq_len` token ids uniformly from `[0, vocab_size)`.

    Rows are full, so every attention mask is all ones. The same arguments give the same
    tokens on every platform (`numpy.random.default_rng(seed)`).

    Example::

        >>> calib = make_synthetic_text_batches(vocab_size=100, samples=4, seq_len=8, seed=0)
        >>> calib.batches[0]["input_ids"].shape, calib.num_tokens
        (torch.Size([1, 8]), 32)
    """
    if vocab_size < 1:
        raise DataError(
            f"vocab_size must be at least 1, got {vocab_size}",
            hint="Pass the model config's vocab_size.",
            param="vocab_size",
        )
    check_sizes(samples=samples, seq_len=seq_len, batch_size=batch_size)
    tokens = np.random.default_rng(seed).integers(0, vocab_size, size=(samples, seq_len))
    batches = pad_batches(tokens, batch_size=batch_size, pad_id=0)
    return CalibrationSet(
        batches=batches,
        num_samples=samples,
        seq_len=seq_len,
        num_tokens=samples * seq_len,
        source=f"synthetic: uniform token ids below {vocab_size}",
        seed=seed,
    )
