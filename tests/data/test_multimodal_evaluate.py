"""Perplexity of text given images or audio, against the model's own loss with labels.

The reference is what transformers computes when handed `labels`: the mean cross-entropy of the
shifted targets, with padding and media placeholders set to -100 (ignored), as a training
script for these models masks them. Our figure comes from other batches (two rows padded
together), so padding handling is checked too.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmc_trace.data import load_multimodal_calibration
from llmc_trace.evaluate import evaluate_multimodal, perplexity
from tests.multimodal import load_twin


def reference_perplexity(model, calibration) -> tuple[float, int]:
    """exp(mean NLL) over every scored target, from the model's own loss, batch by batch."""
    nll_sum, count = 0.0, 0
    with torch.no_grad():
        for batch in calibration.batches:
            labels = batch["input_ids"].clone()
            labels[batch["attention_mask"] == 0] = -100
            labels[torch.isin(labels, torch.tensor(calibration.placeholder_ids))] = -100
            scored = int((labels[:, 1:] != -100).sum())
            nll_sum += float(model(**batch, labels=labels).loss) * scored
            count += scored
    return math.exp(nll_sum / count), count


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("Qwen/Qwen2-VL-2B-Instruct", "drawn_rows"),
        ("google/gemma-3-4b-it", "drawn_rows"),
        ("Qwen/Qwen2-Audio-7B-Instruct", "tone_rows"),
    ],
)
def test_perplexity_given_media_equals_the_models_loss(name, rows, twins, request):
    folder, rows = twins(name), request.getfixturevalue(rows)
    one_by_one = load_multimodal_calibration(
        rows, folder, samples=2, seq_len=512, batch_size=1, shuffle=False
    )
    expected, scored = reference_perplexity(load_twin(folder), one_by_one)
    result = evaluate_multimodal(
        folder, rows, samples=2, seq_len=512, batch_size=2, dtype=torch.float32
    )
    assert result.num_tokens == scored
    assert result.perplexity == pytest.approx(expected, rel=1e-4)


def test_placeholders_are_not_scored(twins, drawn_rows):
    """Scoring the image tokens too would change the figure and the count: the count is the
    real targets minus the placeholders."""
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    calibration = load_multimodal_calibration(
        drawn_rows, folder, samples=2, seq_len=512, batch_size=2, shuffle=False
    )
    result = perplexity(load_twin(folder), calibration)
    targets = sum(int(b["attention_mask"][:, 1:].sum()) for b in calibration.batches)
    images = sum(
        int((b["input_ids"][:, 1:] == calibration.media_token_id).sum())
        for b in calibration.batches
    )
    assert result.num_tokens == targets - images
