"""Measure a causal language model's perplexity on token rows or a calibration set.

Perplexity is computed as the refmodel's `train.py` does it, so that numbers are comparable with
its README: each row runs independently (no state carried between rows), the logits of positions
`0..T-2` are log-softmaxed in float32 and scored against the tokens at `1..T-1`, and perplexity
is `exp(total NLL / scored tokens)`. Padding is never scored: a target counts only when it and
the position predicting it both have attention mask 1, so right-padded batches of uneven texts
give the same result as running each text alone. Token ids must index the model's embedding
table, and logits that are not finite are refused, naming the module where they diverged
(:mod:`~llmc_trace.evaluate.diverged`): neither ever becomes a number.

A `MultimodalCalibrationSet` is scored the same way, as the perplexity of its text given its
media: each batch runs whole (`model(**batch)`: pixel values, grids, audio features), and a
target that is a media placeholder token (`placeholder_ids`) is never scored, since the model
does not predict the vision tower's embeddings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from llmc_trace.core.progress import Progress
from llmc_trace.data import CalibrationSet
from llmc_trace.data.multimodal import MultimodalCalibrationSet
from llmc_trace.data.tokens import check_token_range
from llmc_trace.errors import DataError
from llmc_trace.evaluate.diverged import check_logits


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexity with what it was computed from.

    `nll` is the mean negative log-likelihood per scored token, in nats, so
    `perplexity == exp(nll)`; `num_tokens` counts the scored tokens (each row's first token is
    context only and never scored).
    """

    perplexity: float
    nll: float
    num_tokens: int
    elapsed_s: float
    #: what the scored text was given: ``"text"`` alone, or its ``"image"``, ``"video"`` or
    #: ``"audio"`` (the modality detected from the data's columns, or the one forced)
    modality: str = "text"
    #: how much of the data was scored, in a sentence each; the command line prints them
    notes: tuple[str, ...] = ()


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    data: np.ndarray | torch.Tensor | CalibrationSet,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> PerplexityResult:
    """Compute the perplexity of `model` on `data`.

    `model` is a causal language model called as `model(input_ids=..., attention_mask=...)`
    that returns an object with `.logits` of shape `(B, T, vocab)`, as every Hugging Face
    `*ForCausalLM` (and `*ForConditionalGeneration`) does. `data` is a 2-D array of token ids,
    one sample per row (batched by `batch_size`), or a `CalibrationSet` (its own batches and
    masks are used, with every tensor of a `MultimodalCalibrationSet`'s batches; `batch_size`
    is ignored). The model runs in eval mode and is put back in its previous mode afterwards.

    Example::

        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=1, num_attention_heads=2)
        >>> result = perplexity(LlamaForCausalLM(config), np.zeros((2, 5), dtype=np.int64))
        >>> result.num_tokens
        8
    """
    if batch_size < 1:
        raise DataError(
            f"batch_size must be at least 1, got {batch_size}",
            hint="Pass 1 or more.",
            param="batch_size",
        )
    batches, total_rows = _batches(data, batch_size, model.get_input_embeddings().num_embeddings)
    parameter = next(model.parameters())
    placeholders = torch.tensor(
        data.placeholder_ids if isinstance(data, MultimodalCalibrationSet) else (),
        dtype=torch.long,
        device=parameter.device,
    )
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    nll_sum, num_tokens, done_rows = 0.0, 0, 0
    try:
        for number, batch in enumerate(batches):
            inputs = {
                # media tensors (pixel values, audio features) in the model's dtype
                name: value.to(parameter.device, parameter.dtype)
                if value.is_floating_point()
                else value.to(parameter.device)
                for name, value in batch.items()
            }
            input_ids, attention_mask = inputs["input_ids"], inputs["attention_mask"]  # (B, T)
            logits = model(**inputs).logits
            check_logits(model, inputs, logits, number)
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, vocab)
            target_log_probs = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
            scored = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()  # (B, T-1)
            scored &= ~torch.isin(input_ids[:, 1:], placeholders)
            # Sum in float64: 10^5 float32 terms of size ~4 would lose the third digit.
            nll_sum -= target_log_probs[scored].double().sum().item()
            num_tokens += int(scored.sum())
            done_rows += input_ids.shape[0]
            if progress is not None:
                progress("rows", done_rows, total_rows)
    finally:
        model.train(was_training)
    if num_tokens == 0:
        raise DataError(
            "no token could be scored: every row has fewer than 2 real tokens",
            hint="Evaluate on rows of at least 2 tokens.",
        )
    nll = nll_sum / num_tokens
    return PerplexityResult(
        perplexity=math.exp(nll),
        nll=nll,
        num_tokens=num_tokens,
        elapsed_s=time.perf_counter() - start,
    )


def _batches(
    data: np.ndarray | torch.Tensor | CalibrationSet, batch_size: int, vocab_size: int
) -> tuple[list[dict[str, torch.Tensor]] | Iterator[dict[str, torch.Tensor]], int]:
    """The batches to score and the number of rows in all of them. A calibration set's ids
    were checked when it was loaded; an array's are checked here against the ``vocab_size``
    rows of the model's embedding table."""
    if isinstance(data, CalibrationSet):
        return data.batches, data.num_samples
    tokens = torch.as_tensor(data)
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise DataError(
            f"tokens must be a 2-D integer array (rows of token ids), got a {tokens.ndim}-D "
            f"{tokens.dtype} array",
            hint="Pass an array shaped (rows, seq_len), e.g. np.load('eval.npy'), or a "
            "CalibrationSet.",
        )
    check_token_range(tokens, vocab_size, "the token array")
    tokens = tokens.long()

    def rows_in_batches() -> Iterator[dict[str, torch.Tensor]]:
        for first in range(0, tokens.shape[0], batch_size):
            input_ids = tokens[first : first + batch_size]
            yield {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

    return rows_in_batches(), tokens.shape[0]
