"""``compress``: end to end on small saved models, and quality on the trained reference model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from llmc_trace.algorithms.scheme import W4A16
from llmc_trace.errors import BadInputError
from llmc_trace.evaluate import perplexity
from llmc_trace.oneshot import CompressRequest, compress, parse_sparsity


def test_checkpoint_reloads_in_transformers_with_our_numbers(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    out = tmp_path / "out"
    result = compress(
        CompressRequest(str(folder), dataset=data, out_dir=out, samples=8, seq_len=64)
    )
    assert result.pipeline == "sequential" and out.is_dir()
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "recipe.yaml"}
    assert len(result.layers) == 14  # 7 Linear layers per decoder layer, lm_head ignored
    shared = [layer for layer in result.layers if layer.shares_hessian_with]
    assert {layer.name.rsplit(".", 1)[1] for layer in shared} == {"k_proj", "v_proj", "up_proj"}

    assert all(p.is_meta for p in result.model.parameters())  # streamed: nothing held

    # the streamed run's checkpoint is the model the in-memory run computes
    in_memory = compress(
        CompressRequest(str(folder), dataset=data, out_dir=None, samples=8, seq_len=64)
    )
    assert [r.loss for r in in_memory.layers] == [r.loss for r in result.layers]
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.as_tensor(np.load(data)[:4], dtype=torch.long)
    with torch.no_grad():
        ours = in_memory.model(input_ids=tokens).logits
        theirs = reloaded(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)


def test_true_sequential_calibrates_in_stages_and_says_so(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    out = tmp_path / "out"
    result = compress(
        CompressRequest(
            str(folder), dataset=data, out_dir=out, samples=8, seq_len=64, true_sequential=True
        )
    )
    assert result.stats.passes == [1, 5, 4]  # embeddings; 4 stages + propagation; 4 stages
    shared = [layer for layer in result.layers if layer.shares_hessian_with]
    assert {layer.name.rsplit(".", 1)[1] for layer in shared} == {"k_proj", "v_proj", "up_proj"}
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    (stage,) = recipe["stages"]
    assert stage["true_sequential"] is True and stage["pipeline"] == "sequential"
    assert recipe["calibration"]["attn_implementation"] == "sdpa"
    assert stage["refine_passes"] == 0
    plain = compress(
        CompressRequest(str(folder), dataset=data, out_dir=None, samples=8, seq_len=64)
    )
    o_proj = "model.layers.0.self_attn.o_proj"
    assert [r.loss for r in result.layers if r.name == o_proj] != [
        r.loss for r in plain.layers if r.name == o_proj
    ]  # o_proj saw the compressed q/k/v outputs


def test_interrupted_write_leaves_no_folder(
    saved_llama: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, data = saved_llama
    from llmc_trace.checkpoint import shards

    def explode(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(shards.ShardedSafetensors, "put", explode)
    with pytest.raises(KeyboardInterrupt):
        compress(
            CompressRequest(
                str(folder), dataset=data, out_dir=tmp_path / "out", samples=8, seq_len=64
            )
        )
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"scheme": "W3A7"}, "scheme"),
        ({"method": "sparsegpt", "sparsity": "1.5"}, "sparsity"),
        ({"method": "sparsegpt", "sparsity": "4:2"}, "sparsity"),
        ({"samples": 100}, None),
        ({"scheme": W4A16.with_weights(group_size=256)}, "scheme"),
        ({"group_size": 48}, "group_size"),  # the 128-wide layers take no 48-column groups
        ({"scheme": "FP8_BLOCK"}, "scheme"),  # k_proj's 64 rows are no 128-row block
        ({"scheme": "FP8"}, "scheme"),  # static activation scales
        ({"scheme": "NVFP4A16", "group_size": 32}, "group_size"),  # NVFP4's groups are 16
        ({"scheme": W4A16.__class__("none", W4A16.weights, targets=("Conv2d",))}, "scheme"),
        ({"true_sequential": True, "pipeline": "basic"}, "true_sequential"),
        ({"true_sequential": True, "propagate": False}, "true_sequential"),
        ({"refine_passes": -1}, "refine_passes"),
    ],
)
def test_bad_input_fails_before_heavy_work(
    saved_llama: tuple[Path, Path], tmp_path: Path, kwargs: dict, param: str | None
) -> None:
    folder, data = saved_llama
    arguments = {"dataset": data, "out_dir": tmp_path / "out", "samples": 8, "seq_len": 64}
    with pytest.raises(BadInputError) as info:
        compress(CompressRequest(str(folder), **{**arguments, **kwargs}))
    if param is not None:
        assert info.value.param == param
    assert not (tmp_path / "out").exists()


def test_parse_sparsity() -> None:
    assert parse_sparsity("0.5") == 0.5 and parse_sparsity("2:4") == (2, 4)
    for bad in ("0", "1", "-0.1", "2:2", "x"):
        with pytest.raises(BadInputError):
            parse_sparsity(bad)


@pytest.mark.slow
def test_gptq_beats_rtn_and_propagation_reaches_later_layers(refmodel_dir: Path) -> None:
    """2-bit group 64 on 8 calibration samples: GPTQ far below round-to-nearest either way.

    Error propagation (sequential) against the basic pipeline is no ordering to assert: on this
    model and these 8 samples their perplexities differ by 0.2% (114.0 against 113.8, basic
    lower), the size of a calibration draw's effect. What holds everywhere: the first layer sees the same
    inputs in both pipelines and gets the same weights; later layers see the compressed model's
    own activations and get different ones; and both land within 2% of each other."""
    scheme = W4A16.with_weights(num_bits=2, group_size=64)
    eval_rows = np.load(refmodel_dir / "eval.npy")[:8]
    calib = refmodel_dir / "calib.npy"

    models: dict[str, torch.nn.Module] = {}

    def ppl(**kwargs: object) -> float:
        result = compress(
            CompressRequest(
                str(refmodel_dir),
                dataset=calib,
                out_dir=None,
                scheme=scheme,
                samples=8,
                seq_len=512,
                dtype=torch.float32,
                **kwargs,
            )
        )
        assert len(result.layers) == 42
        models[str(kwargs.get("pipeline", kwargs["method"]))] = result.model
        return perplexity(result.model, eval_rows).perplexity

    baseline = perplexity(
        AutoModelForCausalLM.from_pretrained(refmodel_dir, dtype=torch.float32), eval_rows
    ).perplexity
    rtn = ppl(method="rtn")
    gptq_sequential = ppl(method="gptq")
    gptq_basic = ppl(method="gptq", pipeline="basic")
    # measured on 8 rows 114.0 against 117.7 (3.2% lower; basic 113.8, the float model 113.1):
    # 0.98x leaves 1.4 of perplexity, ~30x what float order moves it (guides/benchmarks.md, quality on the reference model)
    assert baseline < gptq_sequential < 0.98 * rtn and gptq_basic < 0.98 * rtn
    assert abs(gptq_sequential - gptq_basic) < 0.02 * gptq_basic
    first = [f"model.layers.0.{p}.weight" for p in ("self_attn.q_proj", "mlp.down_proj")]
    last = [f"model.layers.5.{p}.weight" for p in ("self_attn.q_proj", "mlp.down_proj")]
    sequential, basic = models["gptq"].state_dict(), models["basic"].state_dict()
    assert all(torch.equal(sequential[name], basic[name]) for name in first)
    assert not any(torch.equal(sequential[name], basic[name]) for name in last)


def test_data_free_stages_need_no_dataset(saved_llama: tuple[Path, Path], tmp_path: Path) -> None:
    """Round-to-nearest and magnitude pruning read the weights alone: without a dataset they
    write the very tensors a run given one writes; a calibrating method still asks for data."""
    from safetensors.torch import load_file

    folder, data = saved_llama
    stages = dict(method="rtn", scheme="W4A16")
    compress(CompressRequest(str(folder), out_dir=tmp_path / "free", **stages))
    given_data = dict(dataset=data, samples=8, seq_len=64)
    compress(CompressRequest(str(folder), out_dir=tmp_path / "data", **given_data, **stages))
    free = load_file(tmp_path / "free" / "model.safetensors")
    given = load_file(tmp_path / "data" / "model.safetensors")
    assert free.keys() == given.keys() and any(k.endswith("weight_packed") for k in free)
    for key, tensor in free.items():
        assert torch.equal(tensor, given[key]), key
    recipe = yaml.safe_load((tmp_path / "free" / "recipe.yaml").read_text())
    assert recipe["calibration"]["dataset"] is None
    with pytest.raises(BadInputError, match="gptq calibrates on data") as info:
        CompressRequest(str(folder), out_dir=tmp_path / "gptq", method="gptq")
    assert info.value.param == "dataset"


def test_asymmetric_checkpoint_loads_for_evaluation_with_our_logits(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """W4A16_ASYM stores zero points packed, as compressed-tensors' compressor writes them and
    vLLM reads them; transformers 5 with compressed-tensors 0.20 builds them unpacked and
    refuses the file unless told to decompress while loading, which our loader does."""
    from llmc_trace.evaluate.run import load_for_evaluation

    folder, data = saved_llama
    out = tmp_path / "asym"
    request = dict(dataset=data, scheme="W4A16_ASYM", method="rtn", samples=2, seq_len=16)
    compress(CompressRequest(str(folder), out_dir=out, **request))
    in_memory = compress(CompressRequest(str(folder), out_dir=None, **request))
    reloaded = load_for_evaluation(out, dtype=torch.float32).eval()
    tokens = torch.as_tensor(np.load(data)[:2], dtype=torch.long)
    with torch.no_grad():
        ours = in_memory.model(input_ids=tokens).logits
        theirs = reloaded(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
