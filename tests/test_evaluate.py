"""Perplexity against the refmodel README and against an unbatched, unpadded reference."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from llmc_trace.data import CalibrationSet, DataError, load_calibration
from llmc_trace.evaluate import perplexity
from refmodel import FOLDER as REFMODEL
from tests.conftest import refmodel_result


@pytest.fixture(scope="module")
def refmodel(refmodel_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(refmodel_dir, dtype=torch.float32)


def test_refmodel_eval_perplexity_matches_its_training_script(refmodel: torch.nn.Module) -> None:
    """The training script's own perplexity (the code behind the README's and results.json's
    eval figures) on the same rows: two implementations, one number. The whole eval set is
    the calibration-set test's job below and the quality benchmark's."""
    from refmodel.train import perplexity as training_perplexity

    rows = np.load(REFMODEL / "eval.npy")[:24]
    result = perplexity(refmodel, rows, batch_size=8)
    assert result.perplexity == pytest.approx(training_perplexity(refmodel, rows), rel=1e-5)
    assert result.num_tokens == 24 * 511
    assert result.perplexity == pytest.approx(math.exp(result.nll))


def test_refmodel_calib_perplexity_through_a_calibration_set(refmodel: torch.nn.Module) -> None:
    calib = load_calibration(
        REFMODEL / "calib.npy", samples=64, seq_len=512, shuffle=False, batch_size=8
    )
    result = perplexity(refmodel, calib)
    assert result.perplexity == pytest.approx(refmodel_result()["calib64_ppl"], abs=0.05)
    assert result.num_tokens == 64 * 511


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def _reference_nll_sum(model: torch.nn.Module, rows: list[torch.Tensor]) -> tuple[float, int]:
    """Total NLL and token count, each row run alone with no padding and no mask."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=row[None]).logits[0].double()
            total += F.cross_entropy(logits[:-1], row[1:], reduction="sum").item()
            count += len(row) - 1
    return total, count


def test_padded_batches_score_like_unpadded_rows(tiny_model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(1)
    lengths = [9, 3, 12, 1, 7]  # a 1-token row has nothing to score
    rows = [torch.randint(0, 61, (n,), generator=generator) for n in lengths]
    batches = []
    for first in (0, 3):
        chunk = rows[first : first + 3]
        width = max(len(row) for row in chunk)
        input_ids = torch.full((len(chunk), width), 5, dtype=torch.long)  # 5: arbitrary padding
        attention_mask = torch.zeros_like(input_ids)
        for i, row in enumerate(chunk):
            input_ids[i, : len(row)] = row
            attention_mask[i, : len(row)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask})
    calib = CalibrationSet(
        batches=batches, num_samples=5, seq_len=12, num_tokens=sum(lengths), source="test", seed=1
    )
    seen: list[tuple[int, int]] = []
    result = perplexity(
        tiny_model, calib, progress=lambda stage, done, total: seen.append((done, total))
    )
    total, count = _reference_nll_sum(tiny_model, rows)
    assert result.num_tokens == count == sum(lengths) - len(lengths)
    assert result.nll == pytest.approx(total / count, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(total / count), rel=1e-5)
    assert seen == [(3, 5), (5, 5)]


def test_token_array_matches_reference_at_any_batch_size(tiny_model: torch.nn.Module) -> None:
    tokens = np.random.default_rng(2).integers(0, 61, size=(7, 10)).astype(np.int32)
    total, count = _reference_nll_sum(tiny_model, list(torch.as_tensor(tokens, dtype=torch.long)))
    for batch_size in (1, 3, 8):
        result = perplexity(tiny_model, tokens, batch_size=batch_size)
        assert result.num_tokens == count == 7 * 9
        assert result.nll == pytest.approx(total / count, rel=1e-5)
    assert perplexity(tiny_model, torch.as_tensor(tokens)).nll == pytest.approx(
        total / count, rel=1e-5
    )


def test_model_mode_is_restored(tiny_model: torch.nn.Module) -> None:
    tiny_model.train()
    try:
        perplexity(tiny_model, np.zeros((1, 4), dtype=np.int64))
        assert tiny_model.training
    finally:
        tiny_model.eval()


def test_bad_inputs_say_what_to_pass(tiny_model: torch.nn.Module) -> None:
    with pytest.raises(DataError, match="2-D integer array") as caught:
        perplexity(tiny_model, np.zeros(10, dtype=np.int64))
    assert "(rows, seq_len)" in caught.value.hint
    with pytest.raises(DataError, match="2-D integer array"):
        perplexity(tiny_model, np.zeros((2, 4), dtype=np.float32))
    with pytest.raises(DataError, match="no token could be scored"):
        perplexity(tiny_model, np.zeros((3, 1), dtype=np.int64))
    with pytest.raises(DataError, match="batch_size must be at least 1"):
        perplexity(tiny_model, np.zeros((3, 4), dtype=np.int64), batch_size=0)
