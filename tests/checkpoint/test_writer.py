"""The acid test: transformers loads our checkpoints back with our numbers, and writes are atomic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from _checkpoint_data import (
    eval_tokens,
    layer_hessians,
    load_refmodel,
    loads_sparse_only,
    perplexity,
)
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.utils.quantization_config import CompressedTensorsConfig

from llmc_trace.checkpoint import SparsityInfo, save_compressed, shards, unpack_from_int32
from llmc_trace.core.versions import release
from llmc_trace.errors import BadInputError
from llmc_trace.models import build
from llmc_trace.models.build import load_pretrained
from llmc_trace.models.source import resolve_model
from llmc_trace.oneshot import Stage
from llmc_trace.spec.recipe import Recipe, render_recipe
from llmc_trace.spec.settings import CalibrationSettings, CheckpointSettings, TracingSettings
from llmc_trace.algorithms import (
    W4A16,
    W4A16_ASYM,
    W8A8,
    W8A16,
    CheckpointError,
    QuantizationScheme,
    QuantizedWeight,
    dequantize,
    gptq,
    magnitude_prune,
    rtn,
    sparsegpt,
)

RECIPE = render_recipe(
    Recipe(
        CalibrationSettings("calib.npy", samples=4, seq_len=512, seed=0),
        TracingSettings(),
        CheckpointSettings(),
        (Stage("gptq", W4A16, pipeline="sequential"),),
    )
)


def quantize_with_gptq(model: torch.nn.Module, folder: Path) -> dict[str, QuantizedWeight]:
    """GPTQ every targeted layer from inputs of the unquantized model (not sequentially)."""
    hessians = layer_hessians(model, W4A16, np.load(folder / "calib.npy")[:4])
    return {
        name: gptq(model.get_submodule(name).weight.data, H, W4A16.weights).quantized
        for name, H in hessians.items()
    }


def quantize_with_rtn(
    model: torch.nn.Module, scheme: QuantizationScheme
) -> dict[str, QuantizedWeight]:
    return {
        name: rtn(module.weight.data, scheme.weights)
        for name, module in model.named_modules()
        if scheme.is_target(name, module)
    }


def apply(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Our in-memory fake-quantized (or pruned) model: the reference the reload must match."""
    for name, weight in weights.items():
        model.get_submodule(name).weight.data.copy_(weight)


@pytest.fixture(scope="module")
def gptq_checkpoint(
    refmodel_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module, dict[str, QuantizedWeight]]:
    model = load_refmodel(refmodel_dir)
    quantized = quantize_with_gptq(model, refmodel_dir)
    out_dir = tmp_path_factory.mktemp("w4a16") / "checkpoint"
    save_compressed(model, out_dir, quantized, [W4A16], recipe=RECIPE, source_dir=refmodel_dir)
    apply(model, {name: q.weight for name, q in quantized.items()})
    return out_dir, model, quantized


def test_w4a16_checkpoint_reloads_with_our_logits_and_perplexity(
    gptq_checkpoint: tuple[Path, torch.nn.Module, dict[str, QuantizedWeight]], refmodel_dir: Path
) -> None:
    out_dir, ours, _ = gptq_checkpoint
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    tokens = eval_tokens(refmodel_dir)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, ours(tokens).logits, rtol=0, atol=1e-5)
    assert perplexity(reloaded, tokens) == pytest.approx(perplexity(ours, tokens), rel=1e-6)


def test_dequantizing_load_gives_our_weights_bit_for_bit(
    gptq_checkpoint: tuple[Path, torch.nn.Module, dict[str, QuantizedWeight]],
) -> None:
    out_dir, _, quantized = gptq_checkpoint
    config = CompressedTensorsConfig(dequantize=True)
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, quantization_config=config)
    for name, q in quantized.items():
        assert torch.equal(reloaded.get_submodule(name).weight, q.weight), name


def test_stored_integers_dequantize_to_our_weights(
    gptq_checkpoint: tuple[Path, torch.nn.Module, dict[str, QuantizedWeight]],
) -> None:
    out_dir, model, quantized = gptq_checkpoint
    with safe_open(out_dir / "model.safetensors", "pt") as stored:
        names = set(stored.keys())
        for name, q in quantized.items():
            packed = stored.get_tensor(f"{name}.weight_packed")
            shape = stored.get_tensor(f"{name}.weight_shape")
            scale = stored.get_tensor(f"{name}.weight_scale")
            assert packed.dtype == torch.int32 and shape.dtype == torch.int64
            assert scale.dtype == torch.float32 and f"{name}.weight_zero_point" not in names
            ints = unpack_from_int32(packed, 4, tuple(shape.tolist()))
            assert torch.equal(dequantize(ints, scale, torch.zeros_like(scale), q.args), q.weight)
        assert stored.get_tensor("lm_head.weight").dtype == torch.float32
    plain = {n for n in names if not n.endswith(("_packed", "_scale", "_shape"))}
    assert plain == {n for n in model.state_dict() if n.removesuffix(".weight") not in quantized}


def test_config_recipe_and_tokenizer_files(
    gptq_checkpoint: tuple[Path, torch.nn.Module, dict[str, QuantizedWeight]], refmodel_dir: Path
) -> None:
    out_dir, _, _ = gptq_checkpoint
    config = json.loads((out_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert "_name_or_path" not in config  # no absolute paths in the output
    quantization = config["quantization_config"]
    assert quantization["ignore"] == ["lm_head"] and quantization["format"] == "pack-quantized"
    recipe = (out_dir / "recipe.yaml").read_text()
    assert 'method: "gptq"' in recipe and 'name: "W4A16"' in recipe and "seed: 0" in recipe
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out_dir / name).read_bytes() == (refmodel_dir / name).read_bytes()
    assert sorted(p.name for p in out_dir.parent.iterdir()) == ["checkpoint"]  # no leftovers


def test_the_source_generation_config_and_use_cache_are_kept(
    refmodel_dir: Path, tmp_path: Path
) -> None:
    """Calibration builds the model with caches off and from its config alone: the checkpoint
    still says what the source folder says (stop tokens, sampling defaults, caches on)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (source / name).symlink_to(refmodel_dir / name)
    generation = {"eos_token_id": [0, 5], "do_sample": True, "temperature": 0.6, "top_p": 0.9}
    (source / "generation_config.json").write_text(json.dumps(generation))
    model = load_pretrained(resolve_model(str(source)))
    assert model.config.use_cache is False  # as calibration runs it
    quantized = quantize_with_rtn(model, W4A16)
    out_dir = save_compressed(model, tmp_path / "checkpoint", quantized, source_dir=source)
    assert json.loads((out_dir / "generation_config.json").read_text()) == generation
    assert transformers.AutoConfig.from_pretrained(out_dir).use_cache is True
    loaded = transformers.GenerationConfig.from_pretrained(out_dir)
    assert (loaded.eos_token_id, loaded.do_sample, loaded.temperature) == ([0, 5], True, 0.6)


def test_writing_twice_gives_identical_bytes(refmodel_dir: Path, tmp_path: Path) -> None:
    model = load_refmodel(refmodel_dir)
    quantized = quantize_with_rtn(model, W4A16)
    for out_dir in (tmp_path / "a", tmp_path / "b"):
        save_compressed(model, out_dir, quantized, [W4A16], recipe=RECIPE)
    for file in sorted((tmp_path / "a").iterdir()):
        assert file.read_bytes() == (tmp_path / "b" / file.name).read_bytes(), file.name


@pytest.mark.parametrize(
    ("scheme", "dtype"),
    [
        (W4A16, torch.bfloat16),
        (W4A16_ASYM, torch.float32),
        (W8A16, torch.float32),
        (W8A8, torch.bfloat16),
        (W4A16.with_weights(strategy="channel", group_size=None, observer="mse"), torch.float32),
    ],
    ids=["w4a16-bf16", "w4a16-asym", "w8a16", "w8a8-bf16", "w4a16-channel-mse"],
)
def test_every_scheme_reloads_to_our_weights(
    refmodel_dir: Path, tmp_path: Path, scheme: QuantizationScheme, dtype: torch.dtype
) -> None:
    model = load_refmodel(refmodel_dir, dtype)
    quantized = quantize_with_rtn(model, scheme)
    save_compressed(model, tmp_path / "checkpoint", quantized, [scheme])
    config = CompressedTensorsConfig(dequantize=True)
    reloaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "checkpoint", quantization_config=config
    )
    assert reloaded.dtype == dtype
    for name, q in quantized.items():
        assert torch.equal(reloaded.get_submodule(name).weight, q.weight), name


@pytest.mark.xfail(
    release(transformers.__version__) >= (5, 23),
    strict=True,
    raises=RuntimeError,
    reason="from transformers 5.23 on, compressed-tensors 0.20 prepares asymmetric "
    "pack-quantized modules on the meta device without packing their zero points, so "
    "transformers' default (compressed) load rejects the packed zero points that "
    "compressed-tensors itself writes (llm-compressor #1618); load with "
    "CompressedTensorsConfig(dequantize=True) instead (5.17 to 5.22 load either way).",
)
def test_asymmetric_checkpoint_loads_without_dequantize(refmodel_dir: Path, tmp_path: Path) -> None:
    model = load_refmodel(refmodel_dir)
    save_compressed(
        model, tmp_path / "checkpoint", quantize_with_rtn(model, W4A16_ASYM), [W4A16_ASYM]
    )
    AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")


def test_sparse_quantized_checkpoint_keeps_two_four_and_states_it(
    refmodel_dir: Path, tmp_path: Path
) -> None:
    model = load_refmodel(refmodel_dir)
    scheme = W4A16.with_weights(actorder=None)  # SparseGPT sweeps in input order
    hessians = layer_hessians(model, scheme, np.load(refmodel_dir / "calib.npy")[:2])
    results = {
        name: sparsegpt(model.get_submodule(name).weight.data, H, (2, 4), quantize=scheme.weights)
        for name, H in hessians.items()
    }
    quantized = {name: r.quantized for name, r in results.items() if r.quantized is not None}
    sparsity = SparsityInfo((2, 4), tuple(results))
    save_compressed(model, tmp_path / "checkpoint", quantized, [scheme], sparsity=sparsity)
    apply(model, {name: q.weight for name, q in quantized.items()})

    stated = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    sparsity_config = stated["quantization_config"]["sparsity_config"]
    assert sparsity_config["sparsity_structure"] == "2:4" and sparsity_config["format"] == "dense"
    assert sparsity_config["targets"] is None and sparsity_config["global_sparsity"] >= 0.5

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint").eval()
    tokens = eval_tokens(refmodel_dir, rows=2)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, model(tokens).logits, rtol=0, atol=1e-5)
    for name in results:
        runs = reloaded.get_submodule(name).weight.reshape(-1, 4)
        assert ((runs != 0).sum(-1) <= 2).all(), name


@loads_sparse_only
def test_sparse_only_checkpoint_loads_as_a_dense_model(refmodel_dir: Path, tmp_path: Path) -> None:
    model = load_refmodel(refmodel_dir)
    names = [n for n, m in model.named_modules() if W4A16.is_target(n, m)]
    for name in names:
        weight = model.get_submodule(name).weight.data
        weight.copy_(magnitude_prune(weight, 0.5)[0])
    save_compressed(
        model, tmp_path / "checkpoint", {}, [], sparsity=SparsityInfo(0.5, tuple(names))
    )
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())[
        "quantization_config"
    ]
    assert config["config_groups"] == {} and config["format"] == "dense"
    assert config["sparsity_config"]["sparsity_structure"] == "unstructured"
    assert config["sparsity_config"]["global_sparsity"] == 0.5
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")
    for name in names:
        assert torch.equal(reloaded.get_submodule(name).weight, model.get_submodule(name).weight)


@pytest.mark.parametrize(("version", "loads"), [("5.22.2", False), ("5.23.0", True)])
def test_a_sparse_only_checkpoint_is_refused_where_transformers_cannot_load_it(
    refmodel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, loads: bool
) -> None:
    """transformers before 5.23 fails on a checkpoint that quantizes nothing (its loader reads
    the absent scheme's groups): the load is refused first, naming the release that reads it."""
    model = load_refmodel(refmodel_dir)
    names = [n for n, m in model.named_modules() if W4A16.is_target(n, m)]
    save_compressed(
        model, tmp_path / "checkpoint", {}, [], sparsity=SparsityInfo(0.5, tuple(names))
    )
    if loads and release(transformers.__version__) < release(version):
        pytest.skip(f"transformers {transformers.__version__} cannot load it: the refusal holds")
    # the module object the loader reads: importing some of transformers (its processors)
    # puts another object under sys.modules["transformers"], so a test run's order decides
    # which one a plain `import transformers` here would be
    monkeypatch.setattr(build.transformers, "__version__", version)
    source = resolve_model(str(tmp_path / "checkpoint"))
    if loads:
        assert load_pretrained(source) is not None
        return
    with pytest.raises(BadInputError) as refused:
        load_pretrained(source)
    assert f"transformers {version} cannot load" in str(refused.value)
    assert "quantizes no weights (sparsity alone), which transformers loads from 5.23 on" in str(
        refused.value
    )
    assert refused.value.hint == "Upgrade transformers (pip install -U 'transformers>=5.23')."


class _Interrupted(Exception):
    pass


def _interrupt_after_partial_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tenth tensor's write fails: nine are in the shard, the rest never come."""
    put = shards.ShardedSafetensors.put
    calls = []

    def write_then_fail(self: shards.ShardedSafetensors, name: str, tensor: torch.Tensor) -> None:
        calls.append(name)
        if len(calls) == 10:
            raise _Interrupted
        put(self, name, tensor)

    monkeypatch.setattr(shards.ShardedSafetensors, "put", write_then_fail)


def test_interrupted_write_leaves_no_folder(
    refmodel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_refmodel(refmodel_dir)
    quantized = quantize_with_rtn(model, W4A16)
    _interrupt_after_partial_file(monkeypatch)
    with pytest.raises(_Interrupted):
        save_compressed(model, tmp_path / "checkpoint", quantized, [W4A16])
    assert list(tmp_path.iterdir()) == []


def test_interrupted_overwrite_keeps_the_previous_checkpoint(
    refmodel_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_refmodel(refmodel_dir)
    quantized = quantize_with_rtn(model, W4A16)
    out_dir = save_compressed(model, tmp_path / "checkpoint", quantized, [W4A16])
    before = {file.name: file.read_bytes() for file in out_dir.iterdir()}
    with pytest.raises(CheckpointError, match="already exists"):
        save_compressed(model, out_dir, quantized, [W4A16])
    _interrupt_after_partial_file(monkeypatch)
    with pytest.raises(_Interrupted):
        save_compressed(model, out_dir, quantized, [W4A16], overwrite=True)
    assert {file.name: file.read_bytes() for file in out_dir.iterdir()} == before
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint"]


def test_inconsistent_inputs_are_refused_before_writing(refmodel_dir: Path, tmp_path: Path) -> None:
    model = load_refmodel(refmodel_dir)
    name = "model.layers.0.self_attn.q_proj"
    weight = model.get_submodule(name).weight.data  # (256, 256)
    group_order = W4A16.with_weights(actorder="group")
    cases = {
        "2 schemes target": ({name: rtn(weight, W4A16.weights)}, [W4A16, W8A16]),
        "says": ({name: rtn(weight, W8A16.weights)}, [W4A16]),
        "scales are torch.bfloat16": ({name: rtn(weight.bfloat16(), W4A16.weights)}, [W4A16]),
        "g_idx": (
            {name: gptq(weight, torch.eye(256), group_order.weights).quantized},
            [group_order],
        ),
        "does not fit": ({name: rtn(weight[:, :128], W4A16.weights)}, [W4A16]),
        "no such module": ({"model.missing": rtn(weight, W4A16.weights)}, [W4A16]),
    }
    for message, (quantized, schemes) in cases.items():
        with pytest.raises(CheckpointError, match=message) as info:
            save_compressed(model, tmp_path / "checkpoint", quantized, schemes)
        assert info.value.hint and info.value.location
    assert list(tmp_path.iterdir()) == []


def test_tied_embeddings_are_written_once_and_tied_again(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=96,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    scheme = W4A16.with_weights(group_size=32)
    quantized = quantize_with_rtn(model, scheme)
    save_compressed(model, tmp_path / "checkpoint", quantized, [scheme])
    apply(model, {name: q.weight for name, q in quantized.items()})

    with safe_open(tmp_path / "checkpoint" / "model.safetensors", "pt") as stored:
        names = set(stored.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint").eval()
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(tokens).logits, model(tokens).logits, rtol=0, atol=1e-5)
