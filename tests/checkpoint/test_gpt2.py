"""GPT-2 (``Conv1D`` layers) compresses end to end and reloads in transformers with our numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _checkpoint_data import loads_sparse_only
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from llmc_trace.checkpoint import save_compressed
from llmc_trace.algorithms import W4A16
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.pipelines.basic import run_data_free
from tests.conftest import tiny_gpt2

SCHEME = W4A16.with_weights(group_size=32)  # GPT-2's widths here: 64 and 256


@pytest.fixture
def saved_gpt2(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny random GPT-2 saved as safetensors, and a token array to calibrate it with."""
    folder = tmp_path / "gpt2"
    tiny_gpt2().save_pretrained(folder)
    tokens = np.random.default_rng(0).integers(0, 128, size=(8, 32)).astype(np.int32)
    np.save(tmp_path / "calib.npy", tokens)
    return folder, tmp_path / "calib.npy"


def conv1d_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight.data for n, m in model.named_modules() if isinstance(m, Conv1D)}


def test_gpt2_w4a16_reloads_in_transformers_with_our_logits(
    saved_gpt2: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_gpt2
    out = tmp_path / "out"
    arguments = {"dataset": data, "samples": 8, "seq_len": 32, "scheme": SCHEME}
    streamed = compress(CompressRequest(str(folder), out_dir=out, **arguments))
    in_memory = compress(CompressRequest(str(folder), out_dir=None, **arguments))
    original = conv1d_weights(tiny_gpt2())
    assert [layer.name for layer in streamed.layers] == list(original)  # 4 Conv1D per block
    assert [r.loss for r in streamed.layers] == [r.loss for r in in_memory.layers]

    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.as_tensor(np.load(data)[:4], dtype=torch.long)
    with torch.no_grad():
        ours = in_memory.model(input_ids=tokens).logits
        theirs = reloaded(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)

    # GPTQ's grid runs along each output's inputs (the stored weight's columns): every group
    # of 32 inputs holds at most 16 values, which the original weights do not
    for name, weight in conv1d_weights(reloaded).items():
        by_group = weight.t().reshape(-1, 32)  # (out * in / 32, 32)
        assert max(len(row.unique()) for row in by_group) <= 16, name
        assert not torch.equal(weight, original[name]), name
    # stored dense in the module's own (in, out) layout: no loader reads a Conv1D quantized
    with safe_open(out / "model.safetensors", "pt") as stored:
        assert stored.get_slice("transformer.h.0.attn.c_attn.weight").get_shape() == [64, 192]
        assert not [key for key in stored.keys() if key.endswith("weight_packed")]


@loads_sparse_only
def test_gpt2_sparsegpt_two_four_zeroes_two_of_every_four_inputs(
    saved_gpt2: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_gpt2
    out = tmp_path / "out"
    compress(
        CompressRequest(
            str(folder),
            dataset=data,
            out_dir=out,
            samples=8,
            seq_len=32,
            method="sparsegpt",
            sparsity="2:4",
            scheme=None,
        )
    )
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    weights = conv1d_weights(reloaded)
    assert len(weights) == 8
    for name, weight in weights.items():
        along_inputs = weight.t().reshape(-1, 4)  # 4 consecutive inputs of one output
        assert ((along_inputs == 0).sum(dim=1) == 2).all(), name
        along_outputs = weight.reshape(-1, 4)
        assert not ((along_outputs == 0).sum(dim=1) == 2).all(), name
    sparsity = json.loads((out / "config.json").read_text())["quantization_config"]
    assert sparsity["sparsity_config"]["sparsity_structure"] == "2:4"
    assert sparsity["sparsity_config"]["global_sparsity"] == 0.5


def test_a_quantized_linear_beside_conv1d_layers_names_them_in_ignore(tmp_path: Path) -> None:
    """vLLM builds GPT-2's Conv1D layers as Linear ones, which a "Linear" target reaches: the
    config must name them in ``ignore`` when only the real Linear (lm_head) is packed."""
    model = tiny_gpt2(tie_word_embeddings=False)
    scheme = SCHEME.__class__("W4A16", SCHEME.weights, ignore=())
    compressor = LayerCompressor("rtn", scheme)
    run_data_free(model, [model], compressor)
    assert set(compressor.quantized) == {*conv1d_weights(model), "lm_head"}
    save_compressed(model, tmp_path / "checkpoint", compressor.quantized, [scheme])

    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config["quantization_config"]["ignore"] == list(conv1d_weights(model))
    with safe_open(tmp_path / "checkpoint" / "model.safetensors", "pt") as stored:
        packed = sorted(key for key in stored.keys() if key.endswith("weight_packed"))
    assert packed == ["lm_head.weight_packed"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint").eval()
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, model(tokens).logits, rtol=0, atol=1e-5)
