"""Twins' random weights come from a pool of draws: seeded as before, scaled as asked, no
repeated rows, and torch's own draws everywhere else."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmc_trace.models.build import twin_of_class
from llmc_trace.models.draws import POOL_SIZE, pooled_draws

LLAMA = LlamaConfig(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
)


def test_pooled_values_have_the_mean_spread_and_bounds_asked_for() -> None:
    torch.manual_seed(0)
    with pooled_draws():
        normal = torch.empty(2_000_000).normal_(mean=1.0, std=0.5)
        positional = torch.empty(1000).normal_(1.0, 0.5)
        uniform = torch.empty(2_000_000).uniform_(-3.0, 5.0)
        truncated = torch.nn.init.trunc_normal_(torch.empty(500, 400), std=0.02)
        half = torch.empty(1000, dtype=torch.bfloat16).normal_()
    assert float(normal.mean()) == pytest.approx(1.0, abs=0.01)
    assert float(normal.std()) == pytest.approx(0.5, rel=0.01)
    assert float(positional.mean()) == pytest.approx(1.0, abs=0.1)
    assert float(uniform.min()) >= -3.0 and float(uniform.max()) <= 5.0
    assert float(uniform.mean()) == pytest.approx(1.0, abs=0.02)
    assert float(truncated.abs().max()) <= 2.0 and float(truncated.std()) == pytest.approx(
        0.02, rel=0.05
    )
    assert half.dtype == torch.bfloat16 and float(half.float().std()) == pytest.approx(1, rel=0.1)


def test_no_row_repeats_another_even_in_a_tensor_larger_than_the_pool() -> None:
    rows = 2 * POOL_SIZE // 1000 + 1
    torch.manual_seed(0)
    with pooled_draws():
        weight = torch.empty(rows, 1000).normal_()
    assert weight.numel() > POOL_SIZE
    assert len(torch.unique(weight, dim=0)) == rows


def test_a_given_generator_and_code_outside_the_block_draw_as_torch_does() -> None:
    with pooled_draws():
        inside = torch.empty(100).normal_(generator=torch.Generator().manual_seed(3))
    expected = torch.empty(100).normal_(generator=torch.Generator().manual_seed(3))
    assert torch.equal(inside, expected)
    with pytest.raises(RuntimeError), pooled_draws():
        raise RuntimeError
    torch.manual_seed(5)
    after = torch.empty(10).normal_()
    torch.manual_seed(5)
    assert torch.equal(after, torch.randn(10))


def test_twins_are_seeded_and_their_weights_spread_as_their_init_says() -> None:
    first, again = (twin_of_class(LlamaForCausalLM, LLAMA, seed=0) for _ in range(2))
    other = twin_of_class(LlamaForCausalLM, LLAMA, seed=1)
    for (name, a), b, c in zip(
        first.named_parameters(), again.parameters(), other.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
        if "norm" not in name:  # norms start at one, drawn by nobody
            assert not torch.equal(a, c), name
    weight = first.model.layers[0].mlp.up_proj.weight.detach()
    assert float(weight.std()) == pytest.approx(LLAMA.initializer_range, rel=0.05)
    assert float(first.model.layers[0].input_layernorm.weight.detach().min()) == 1.0
