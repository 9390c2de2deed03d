"""Mixture-of-experts models: every expert is compressed, stored as loaders read it, and said.

Every MoE architecture among the built-ins (transformers 5 stores their experts fused, as 3-D
parameters) is compressed from its tiny twin saved to a folder, as a user would: the checkpoint
must quantize every expert, store it in the architecture's published layout (one tensor set per
expert and projection where its checkpoints are per expert), reload in transformers to the
logits of our in-memory result, and come out of the streamed and in-memory paths alike.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from click.testing import CliRunner
from safetensors import safe_open
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from llmc_trace.cli.main import cli
from llmc_trace.algorithms.scheme import QuantizationArgs, QuantizationScheme
from llmc_trace.moe import fused_experts, observe_experts, per_expert_names
from llmc_trace.core.versions import release
from llmc_trace.errors import BadInputError
from llmc_trace.models import build
from llmc_trace.models.build import INT8_EXPERTS_LOAD, build_meta_model, build_twin, load_pretrained
from llmc_trace.models.shrink import EXPERT_KEYS
from llmc_trace.models.source import ModelSource, builtin_names, builtin_root, resolve_model
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.oneshot.weight_coverage import KindCoverage, parameter_coverage, untouched_share
from tests.test_builtins import read_configs

#: Every built-in whose experts are fused, with whether its checkpoints store them per expert.
MOE_BUILTINS = {
    "Qwen/Qwen3-30B-A3B": True,
    "Qwen/Qwen3-Next-80B-A3B-Thinking": True,
    "Qwen/Qwen3.5-35B-A3B": True,
    "Qwen/Qwen3-VL-30B-A3B-Instruct": False,
    "deepseek-ai/DeepSeek-V3": True,
    "deepseek-ai/DeepSeek-V2-Lite": True,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": True,
    "MiniMaxAI/MiniMax-Text-01-hf": True,
    "MiniMaxAI/MiniMax-M2.7": True,
    "LiquidAI/LFM2-8B-A1B": True,
    "openai/gpt-oss-20b": False,
    "google/gemma-4-26B-A4B": False,
    "ibm-granite/granite-3.1-1b-a400m-instruct": False,
    "arcee-ai/Trinity-Mini": True,
    "poolside/Laguna-XS.2-FP8": True,
    "rednote-hilab/dots.llm1.inst": True,
    "rhymes-ai/Aria": False,
    "tencent/Hy3-preview": True,
    "zai-org/GLM-4.5-Air": True,
    "zai-org/GLM-5": True,
    "zai-org/GLM-4.5V": True,
}

#: Built-ins whose experts transformers fuses only from a later release than the oldest
#: llmc-trace supports: 5.17 runs Aria's as grouped GEMMs of its own, which ``compress``
#: reports as untouched experts (``test_experts_in_a_layout_not_read_are_counted_as_left``).
FUSED_FROM = {"rhymes-ai/Aria": (5, 18)}

#: 4-bit weights, one scale per output channel: the twins' small widths take no group size.
W4_CHANNEL = QuantizationScheme(
    "W4A16", QuantizationArgs(num_bits=4, strategy="channel", group_size=None, actorder="static")
)

#: Attention and linear-attention blocks, by module path.
ATTENTION = r"re:.*(self_attn|linear_attn|attention|mixer|conv)\..*"

#: Twins transformers cannot save: its per-layer config view rejects the shortened stack.
UNSAVABLE = {"google/gemma-4-26B-A4B"}


def _tokens(model: torch.nn.Module, rows: int = 2, seq: int = 12) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    return torch.from_numpy(np.random.default_rng(0).integers(0, vocab, (rows, seq))).long()


def _declares_experts(config: object) -> bool:
    if isinstance(config, dict):
        declared = any(isinstance(config.get(k), int) and config[k] > 1 for k in EXPERT_KEYS)
        return declared or any(_declares_experts(v) for v in config.values())
    return False


def test_every_twin_keeps_the_experts_of_its_model() -> None:
    """A twin cut short before the model's first mixture layer verifies and calibrates no
    expert at all: GLM-5's per-layer MLP kinds, derived from its three dense layers, kept the
    twin's two layers dense until they followed the shortened count. Every built-in with
    fused experts is in :data:`MOE_BUILTINS`, so the tests above reach each."""
    fused, lost = [], []
    for name in builtin_names():
        config = json.loads((builtin_root() / name / "config.json").read_text())
        if not _declares_experts(config) or not _fused_here(name):
            continue
        source = resolve_model(name)
        if fused_experts(build_meta_model(source)):
            fused.append(name)
            if not fused_experts(build_twin(source)):
                lost.append(name)
    assert lost == []
    assert sorted(fused) == sorted(name for name in MOE_BUILTINS if _fused_here(name))


def _fused_here(name: str) -> bool:
    """Whether the installed transformers reads the built-in's config and fuses its experts."""
    return release(transformers.__version__) >= FUSED_FROM.get(name, (0, 0)) and (
        name not in read_configs()[1]
    )


def _moe_source(name: str) -> ModelSource:
    """The built-in, skipped where the installed transformers does not fuse its experts or
    cannot read its config (``test_builtins`` checks what that refusal says)."""
    if not _fused_here(name):
        pytest.skip(f"transformers {transformers.__version__} has no fused experts for {name}")
    return resolve_model(name)


@pytest.mark.parametrize("name", sorted(MOE_BUILTINS))
def test_observed_experts_compute_what_the_model_computes(name: str) -> None:
    """Through its projections, observed on every token or not, each layer of experts gives
    the model's own logits; afterwards the model is as it was."""
    model = build_twin(_moe_source(name))
    ids = _tokens(model)
    with torch.no_grad():
        eager = model(input_ids=ids).logits
        with observe_experts(model) as installed:
            assert installed and len(installed) == len(fused_experts(model))
            routed = model(input_ids=ids).logits
            for state in installed:
                state.observed = frozenset(range(state.num_experts))
            everyone = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    torch.testing.assert_close(routed, eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(everyone, eager, rtol=0, atol=1e-5)
    assert torch.equal(after, eager)
    assert not any(".experts.0." in n for n, _ in model.named_modules())
    path = fused_experts(model)[0][0]
    assert (per_expert_names(model, path) is not None) == MOE_BUILTINS[name]


def _saved_twin(name: str, folder: Path) -> Path:
    """The built-in's tiny twin saved as a bf16 checkpoint (without the FP8 quantization
    config some built-ins declare: the twin's weights are plain)."""
    model = build_twin(_moe_source(name), dtype=torch.bfloat16)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    np.save(folder / "calib.npy", _tokens(model, rows=4, seq=8).numpy().astype(np.int32))
    return folder


@pytest.mark.parametrize("name", sorted(set(MOE_BUILTINS) - UNSAVABLE))
def test_every_moe_builtin_quantizes_every_expert_and_reloads_with_our_logits(
    name: str, tmp_path: Path
) -> None:
    folder = _saved_twin(name, tmp_path / "twin")
    # attention kept dense: some twins keep wide attention outputs (8192 inputs), whose solves
    # would dominate the run; the experts are what this test is about
    scheme = dataclasses.replace(W4_CHANNEL, ignore=(*W4_CHANNEL.ignore, ATTENTION))
    arguments = dict(dataset=folder / "calib.npy", samples=2, seq_len=8, scheme=scheme)
    streamed = compress(CompressRequest(folder, out_dir=tmp_path / "out", **arguments))
    in_memory = compress(CompressRequest(folder, **arguments))

    assert [(r.name, r.loss) for r in streamed.layers] == [
        (r.name, r.loss) for r in in_memory.layers
    ]
    coverage = {row.kind: row for row in streamed.stages[-1].coverage}
    assert coverage["experts"].compressed == coverage["experts"].total > 0
    assert not [r for r in streamed.layers if r.fallback]  # every expert saw every token

    # in the checkpoint's dtype, bf16: our weights are the integers times the scales rounded to
    # it, which is what a loader computes in that dtype (in float32 it keeps the exact product)
    ours = in_memory.model.eval()
    kernel = ours.config._attn_implementation
    reloaded = load_pretrained(resolve_model(str(tmp_path / "out")), kernel, torch.bfloat16)
    ids = _tokens(ours)
    with torch.no_grad():
        original = load_pretrained(resolve_model(str(folder)), kernel, torch.bfloat16)
        _eager_experts(ours, reloaded, original)
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, ours(input_ids=ids).logits, rtol=0, atol=1e-5
        )
        assert not torch.allclose(original(input_ids=ids).logits, ours(input_ids=ids).logits)

    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as stored:
        keys = list(stored.keys())
    per_expert = [k for k in keys if ".experts.0." in k and k.endswith("weight_packed")]
    if MOE_BUILTINS[name]:
        assert len(per_expert) == 3 * len(fused_experts(ours)), per_expert  # gate, up, down
    else:  # published fused: stored dense, with the compressed values
        assert not per_expert
        assert any(k.endswith("experts.gate_up_proj") for k in keys)


def _eager_experts(*models: torch.nn.Module) -> None:
    """The same experts code in every model: loading picks grouped matrix products, which
    need aligned strides the twins' odd widths lack."""
    for model in models:
        for _, experts in fused_experts(model):
            experts.config._experts_implementation = "eager"


def _tiny_qwen3_moe(folder: Path, experts: int = 16) -> Path:
    """A Qwen3-MoE with 16 experts and top-2 routing: 2 rows of 8 tokens leave most experts
    with fewer than 8 routed tokens."""
    config = Qwen3MoeConfig(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=experts,
        num_experts_per_tok=2,
        vocab_size=256,
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    np.save(folder / "calib.npy", np.random.default_rng(1).integers(0, 256, (2, 8)))
    return folder


def test_experts_too_few_tokens_reach_are_rounded_named_and_recorded(tmp_path: Path) -> None:
    folder = _tiny_qwen3_moe(tmp_path / "moe")
    arguments = dict(dataset=folder / "calib.npy", samples=2, seq_len=8, scheme=W4_CHANNEL)
    routed = compress(
        CompressRequest(folder, out_dir=tmp_path / "routed", expert_tokens="routed", **arguments)
    )
    experts = [r for r in routed.layers if ".experts." in r.name]
    assert len(experts) == 2 * 16 * 3
    fallen = [r for r in experts if r.fallback]
    assert len(fallen) > len(experts) // 2  # 32 routed tokens over 16 experts per layer
    assert all(r.fallback.startswith("rtn: ") and "fewer than 8" in r.fallback for r in fallen)
    assert all(r.loss == 0.0 for r in fallen)  # round-to-nearest has no calibration loss
    recipe = (tmp_path / "routed" / "recipe.yaml").read_text()
    assert f"# {len(fallen)} layers compressed otherwise:" in recipe
    assert all(f"#   {r.name}: {r.fallback}" in recipe for r in fallen)
    with safe_open(str(tmp_path / "routed" / "model.safetensors"), "pt") as stored:
        packed = [k for k in stored.keys() if ".experts." in k and k.endswith("weight_packed")]
    assert len(packed) == len(experts)  # every expert stored quantized, fallback or not

    everyone = compress(CompressRequest(folder, **arguments))  # the default: every token
    assert not [r for r in everyone.layers if r.fallback]
    assert all(r.loss > 0 for r in everyone.layers if ".experts." in r.name)


def test_expert_groups_calibrate_every_expert_in_bounded_passes(tmp_path: Path) -> None:
    folder = _tiny_qwen3_moe(tmp_path / "moe")
    arguments = dict(dataset=folder / "calib.npy", samples=2, seq_len=8, scheme=W4_CHANNEL)
    whole = compress(CompressRequest(folder, **arguments))
    grouped = compress(CompressRequest(folder, expert_group=5, **arguments))
    assert sorted(r.name for r in grouped.layers) == sorted(r.name for r in whole.layers)
    # per decoder layer: ceil(16 / 5) = 4 calibration passes, then the propagation pass
    assert max(grouped.stats.passes) == 5
    assert max(whole.stats.passes) == 2
    assert (
        grouped.plan.estimate("sequential").device_bytes
        < whole.plan.estimate("sequential").device_bytes
    )


def test_routers_stay_in_full_precision_and_in_ignore(tmp_path: Path) -> None:
    """Trinity-Mini routes through a Linear (``router.gate``): kept, and named in ``ignore``."""
    folder = _saved_twin("arcee-ai/Trinity-Mini", tmp_path / "twin")
    out = tmp_path / "out"
    result = compress(
        CompressRequest(folder, dataset=folder / "calib.npy", samples=2, seq_len=8, out_dir=out)
    )
    assert not [r for r in result.layers if r.name.endswith("router.gate")]
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert [n for n in ignore if n.endswith("router.gate")]
    assert {row.kind: row.compressed for row in result.stages[-1].coverage}["router"] == 0


def test_a_run_that_leaves_the_experts_says_so(tmp_path: Path) -> None:
    folder = _tiny_qwen3_moe(tmp_path / "moe")
    scheme = QuantizationScheme(
        "W4A16",
        QuantizationArgs(num_bits=4, group_size=16, actorder="static"),
        ignore=("lm_head", "re:.*experts.*"),
    )
    (tmp_path / "recipe.yaml").write_text(
        "stages:\n  - {method: gptq, scheme: "
        + json.dumps(
            {
                "name": scheme.name,
                "weights": {"num_bits": 4, "group_size": 16, "actorder": "static"},
                "targets": list(scheme.targets),
                "ignore": list(scheme.ignore),
            }
        )
        + "}\n"
    )
    run = CliRunner().invoke(
        cli,
        [
            "compress",
            "--model",
            str(folder),
            "--dataset",
            str(folder / "calib.npy"),
            "--recipe",
            str(tmp_path / "recipe.yaml"),
            "--samples",
            "2",
            "--seq-len",
            "8",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert run.exit_code == 0, run.output
    assert "experts 0% of" in run.output
    assert "were not compressed" in run.output
    assert "none of the" in run.output and "expert weights were compressed" in run.output


class _GroupedGemm(torch.nn.Module):
    """Experts as one ``(experts, in, out)`` parameter behind a module of its own, the layout
    transformers 5.17 gives Aria: neither Linear layers nor fused experts llmc-trace reads."""

    def __init__(self, experts: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(experts, in_features, out_features))


def test_experts_in_a_layout_not_read_are_counted_as_left() -> None:
    """Before, weights outside linear layers and embeddings were in no row: a run that left
    every such expert showed only its compressed attention, as if that were all there was."""
    model = torch.nn.Module()
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    layer.self_attn.q_proj = torch.nn.Linear(16, 16)
    layer.input_layernorm = torch.nn.LayerNorm(16)  # one dimension: not a weight matrix
    layer.mlp = torch.nn.Module()
    layer.mlp.experts = torch.nn.Module()
    layer.mlp.experts.fc1 = _GroupedGemm(4, 16, 64)
    layer.mlp.experts.fc2 = _GroupedGemm(4, 32, 16)
    model.layers = torch.nn.ModuleList([layer])
    rows = {row.kind: row for row in parameter_coverage(model, {"layers.0.self_attn.q_proj"})}
    assert rows["attention"] == KindCoverage("attention", 256, 256)
    assert rows["experts"] == KindCoverage("experts", 0, 4 * 16 * 64 + 4 * 32 * 16)
    assert set(rows) == {"attention", "experts"}
    assert untouched_share(list(rows.values())) == pytest.approx(1 - 256 / (256 + 6144))


def test_int8_experts_are_stored_as_vllm_reads_them_and_reload_with_our_logits(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    one_thread: None,
) -> None:
    """W8A8 stores each expert's projection as compressed-tensors' int-quantized tensors (int8
    ``weight``, ``weight_scale``), as llm-compressor does and vLLM reads. transformers 5.24
    alone cannot load them into fused experts (it decompresses experts only from FP8 and packed
    tensors), so ``compress`` warns; ``load_pretrained`` reads them, to our weights."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme as CtScheme
    from transformers import CompressedTensorsConfig

    from llmc_trace.models.int8_experts import reading_int8_experts

    folder = _tiny_qwen3_moe(tmp_path / "moe", experts=4)
    arguments = dict(dataset=folder / "calib.npy", samples=2, seq_len=8, scheme="W8A8")
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="llmc_trace.checkpoint.writer"):
        compress(CompressRequest(folder, out_dir=out, **arguments))
    warned = [r.getMessage() for r in caplog.records if "int-quantized" in r.getMessage()]
    assert len(warned) == 1 and "24 expert projections" in warned[0], caplog.text
    ours = compress(CompressRequest(folder, **arguments)).model

    # the checkpoint: compressed-tensors' own int-quantized decompressor gives our weights
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized"
    scheme = CtScheme.model_validate(config["config_groups"]["group_0"])
    compressor = BaseCompressor.get_value_from_registry("int-quantized")
    prefix = "model.layers.1.mlp.experts.3.down_proj"
    with safe_open(str(out / "model.safetensors"), "pt") as stored:
        tensors = {n: stored.get_tensor(f"{prefix}.{n}") for n in ("weight", "weight_scale")}
    assert tensors["weight"].dtype == torch.int8 and tensors["weight"].shape == (64, 32)
    dense = compressor.decompress(dict(tensors), scheme)["weight"]
    expected = ours.model.layers[1].mlp.experts.down_proj[3]
    torch.testing.assert_close(dense.to(expected.dtype), expected, rtol=0, atol=0)

    # a transformers that cannot read them (5.22 collects no int8 expert weight) refuses the
    # load first, naming the release that reads them; the module object the loader reads
    with monkeypatch.context() as older:
        older.setattr(build.transformers, "__version__", "5.22.2")
        with pytest.raises(BadInputError, match="int8, which transformers loads from 5.23 on"):
            load_pretrained(resolve_model(str(out)))
    if release(transformers.__version__) < INT8_EXPERTS_LOAD:
        pytest.skip(f"transformers {transformers.__version__} cannot load int8 experts")

    # transformers 5.24 alone joins nothing into the fused parameters
    with pytest.raises(RuntimeError, match="automatic conversion of the weights"):
        Qwen3MoeForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    # with the int8 experts read: our fused weights, and decompressed whole, our logits
    reloaded = load_pretrained(resolve_model(str(out)), "eager", torch.bfloat16)
    for (_, got), (_, want) in zip(fused_experts(reloaded), fused_experts(ours), strict=True):
        torch.testing.assert_close(got.gate_up_proj, want.gate_up_proj, rtol=0, atol=0)
        torch.testing.assert_close(got.down_proj, want.down_proj, rtol=0, atol=0)
    with reading_int8_experts():
        whole = Qwen3MoeForCausalLM.from_pretrained(
            out, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True)
        )
    original = Qwen3MoeForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    _eager_experts(ours, whole, original)
    ids = torch.as_tensor(np.load(folder / "calib.npy"), dtype=torch.long)
    with torch.no_grad():
        got = whole(input_ids=ids).logits
        torch.testing.assert_close(got, ours.eval()(input_ids=ids).logits, rtol=0, atol=1e-5)
        assert not torch.allclose(original(input_ids=ids).logits, got)
