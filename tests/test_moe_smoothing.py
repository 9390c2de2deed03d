"""AWQ and SmoothQuant on a mixture of experts: the router balanced with the experts, every
expert's fused weights scaled, and the checkpoints read back by transformers with our numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.moe import fused_experts
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.spec.stage import Stage

EXPERTS = 4


@pytest.fixture
def tiny_moe(tmp_path: Path) -> Path:
    """A bf16 Qwen3-MoE of 2 layers and 4 experts (top 2), with calibration tokens."""
    config = Qwen3MoeConfig(
        hidden_size=128, intermediate_size=128, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, num_experts=EXPERTS,
        num_experts_per_tok=2, vocab_size=256,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path / "moe"
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    np.save(folder / "calib.npy", np.random.default_rng(1).integers(0, 256, (4, 16)))
    return folder


def _reloads_with_our_logits(folder: Path, out: Path, ours: torch.nn.Module) -> torch.nn.Module:
    """The checkpoint at ``out`` loaded by transformers in bf16 computes our model's logits
    (our weights are its integers times its scales); the original model's are different."""
    kernel = ours.config._attn_implementation
    reloaded = load_pretrained(resolve_model(str(out)), kernel, torch.bfloat16)
    original = load_pretrained(resolve_model(str(folder)), kernel, torch.bfloat16)
    for model in (ours, reloaded, original):  # the same experts code in each
        for _, experts in fused_experts(model):
            experts.config._experts_implementation = "eager"
    ids = torch.as_tensor(np.load(folder / "calib.npy")[:2], dtype=torch.long)
    with torch.no_grad():
        got = reloaded(input_ids=ids).logits
        torch.testing.assert_close(got, ours.eval()(input_ids=ids).logits, rtol=0, atol=1e-5)
        assert not torch.allclose(original(input_ids=ids).logits, got)
    return reloaded


def _smoothed(result, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Which pairs were left out: none of the layer's should be."""
    return [line for line in result.fallbacks if prefix in line]


@torch.no_grad()
def test_awq_scales_the_router_with_the_experts_and_reloads(
    tiny_moe: Path, tmp_path: Path, one_thread: None
) -> None:
    arguments = dict(dataset=tiny_moe / "calib.npy", samples=4, seq_len=16, method="awq", n_grid=4)
    out = tmp_path / "awq"
    streamed = compress(CompressRequest(tiny_moe, out_dir=out, **arguments))
    ours = compress(CompressRequest(tiny_moe, **arguments)).model
    assert not _smoothed(streamed, "mlp")  # the norm -> router + experts and up -> down pairs
    reloaded = _reloads_with_our_logits(tiny_moe, out, ours)
    original = Qwen3MoeForCausalLM.from_pretrained(tiny_moe, dtype=torch.bfloat16)
    layer, before = reloaded.model.layers[0].mlp, original.model.layers[0].mlp
    # the router stays in full precision, its columns scaled as the norm's channels were
    norm = reloaded.model.layers[0].post_attention_layernorm.weight.float()
    norm_before = original.model.layers[0].post_attention_layernorm.weight.float()
    s = norm_before / norm  # the folded scale per channel
    assert float((s - 1).abs().max()) > 0.05
    torch.testing.assert_close(
        layer.gate.weight.float(), (before.gate.weight.float() * s), rtol=2e-2, atol=1e-4
    )


def test_smoothquant_then_gptq_on_experts_reloads(
    tiny_moe: Path, tmp_path: Path, one_thread: None
) -> None:
    # W8A16: transformers 5.24 reads no per-expert int8 checkpoint (W8A8's int-quantized
    # format) back into fused experts, smoothed or not; the weight grid is the same 8 bits
    stages = [Stage(method="smoothquant"), Stage(method="gptq", scheme="W8A16")]
    arguments = dict(dataset=tiny_moe / "calib.npy", samples=4, seq_len=16, stages=stages)
    out = tmp_path / "sq"
    streamed = compress(CompressRequest(tiny_moe, out_dir=out, **arguments))
    in_memory = compress(CompressRequest(tiny_moe, **arguments))
    assert not _smoothed(streamed, "mlp")
    experts = [r for r in in_memory.layers if ".experts." in r.name]
    assert len(experts) == 2 * EXPERTS * 3  # every expert quantized after it was smoothed
    reloaded = _reloads_with_our_logits(tiny_moe, out, in_memory.model)
    down = reloaded.model.layers[0].mlp.experts.down_proj
    assert down.shape[0] == EXPERTS  # read back into the fused layout
