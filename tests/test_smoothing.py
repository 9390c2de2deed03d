"""AWQ and SmoothQuant: their scales against the papers' formulas, the folded model against the
unfolded one, and their checkpoints read back by transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from llmc_trace.algorithms.awq import awq_clip, awq_search, clip_shrinks, grid
from llmc_trace.algorithms.quantize import rtn
from llmc_trace.algorithms.scheme import W4A16
from llmc_trace.algorithms.smoothing import fold_scales, norm_offset
from llmc_trace.algorithms.smoothquant import smoothquant_scales
from llmc_trace.errors import BadInputError
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.spec.stage import Stage


def _inputs_and_weights() -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(1024, 128, generator=generator)
    X[:, :4] *= 30  # the outlier channels AWQ and SmoothQuant exist for
    weights = [0.05 * torch.randn(out, 128, generator=generator) for out in (64, 32)]
    return X, weights


def test_awq_loss_from_the_gram_matrix_equals_replaying_the_tokens() -> None:
    X, weights = _inputs_and_weights()
    args = W4A16.with_weights(num_bits=3, group_size=32).weights
    search = awq_search(X.abs().mean(0), X.t() @ X, X.shape[0], weights, args)

    def replayed(s: torch.Tensor) -> float:
        errors = [
            (X / s) @ rtn(W * s, args).weight.t() - X @ W.t()  # type: ignore[union-attr]
            for W in weights
        ]
        return float(sum(e.pow(2).sum() for e in errors) / sum(e.numel() for e in errors))

    assert search.loss == pytest.approx(replayed(search.scales), rel=1e-4)
    assert search.rtn_loss == pytest.approx(replayed(torch.ones(128)), rel=1e-4)
    # outliers on 4 of 128 channels: protecting them cuts the output error by far more than noise
    assert search.loss < 0.8 * search.rtn_loss
    assert search.scales[:4].min() > search.scales[4:].max()


def _layer_with_outlier_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """A layer whose every group holds one weight 8 times their spread, on an input channel
    whose activations are 50 times smaller than the rest: rounding to the grid that outlier
    sets costs every other weight precision, and clamping it costs the output almost nothing
    (what clipping exists for). Its weight and its inputs' Gram matrix per token."""
    generator = torch.Generator().manual_seed(2)
    X = torch.randn(2048, 256, generator=generator)
    W = 0.05 * torch.randn(96, 256, generator=generator)
    quiet = torch.arange(0, 256, 32) + 7  # one channel in each group of 32
    X[:, quiet] *= 0.02
    W[:, quiet] = 0.4 * torch.sign(torch.randn(96, len(quiet), generator=generator))
    return W, X.t() @ X / X.shape[0]


@pytest.mark.parametrize(
    "symmetric,group_size", [(True, 32), (False, 32), (True, None), (False, None)]
)
def test_awq_clip_cuts_the_output_error_of_a_layer_with_outliers(
    symmetric: bool, group_size: int | None
) -> None:
    W, G = _layer_with_outlier_weights()
    strategy = "group" if group_size else "channel"
    args = W4A16.with_weights(symmetric=symmetric, strategy=strategy, group_size=group_size)
    clip = awq_clip(W, G, args.weights)

    def output_error(weight: torch.Tensor) -> float:  # rounded as the checkpoint rounds it
        E = rtn(weight, args.weights).weight - W  # type: ignore[operator]
        return float(((E @ G) * E).sum()) / W.shape[0]

    assert clip.unclipped_loss == pytest.approx(output_error(W), rel=1e-5)
    assert clip.loss == pytest.approx(output_error(clip.weight), rel=1e-5)
    # the outliers cost nothing to clamp: the error falls several-fold, far beyond float noise
    assert clip.loss < 0.5 * clip.unclipped_loss
    assert clip_shrinks(0.5)[0] == 1 and clip_shrinks(0.5)[-1] == pytest.approx(0.55)
    assert float(clip.shrinks.min()) == pytest.approx(0.55)  # the outliers' groups: cut most
    # the weights clamped are the outliers alone (one per row and group)
    assert ((clip.weight - W).abs() > 1e-6).sum() <= W.shape[0] * 8


def test_awq_clip_never_raises_the_exact_output_error() -> None:
    """On a layer without outliers clipping barely helps; the exact objective still never
    rises (the descent keeps a group's shrink unless it lowers the row's whole error)."""
    generator = torch.Generator().manual_seed(3)
    X = torch.randn(512, 128, generator=generator) @ torch.randn(128, 128, generator=generator)
    W = torch.randn(48, 128, generator=generator)
    for symmetric in (True, False):
        args = W4A16.with_weights(symmetric=symmetric, group_size=32).weights
        clip = awq_clip(W, X.t() @ X / 512, args)
        assert clip.loss <= clip.unclipped_loss


def test_awq_grid_spans_zero_to_one_and_starts_with_round_to_nearest() -> None:
    plain = grid(20, False)
    assert len(plain) == 20 and plain[0] == (0.0, False) and max(r for r, _ in plain) < 1
    duo = grid(20, True)
    assert len(duo) == 20 and duo[0] == (0.0, False) and all(d for _, d in duo[1:])
    assert len(grid(20, "both")) == 20


def test_smoothquant_scales_follow_the_paper() -> None:
    X, weights = _inputs_and_weights()
    absmax = X.abs().amax(dim=0)
    s = smoothquant_scales(absmax, weights, alpha=0.5)
    W_absmax = torch.maximum(weights[0].abs().amax(0), weights[1].abs().amax(0))
    torch.testing.assert_close(s, (absmax.sqrt() / W_absmax.sqrt()))
    # after smoothing, the activations' and the weights' ranges per channel are equal
    torch.testing.assert_close(absmax / s, W_absmax * s)


def test_folding_keeps_a_norm_and_linear_pair_exact_gemma_offset_included() -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=generator)
    for norm_class, offset in ((LlamaRMSNorm, 0.0), (Gemma2RMSNorm, 1.0)):
        norm = norm_class(32)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(32, generator=generator))
        linear = torch.nn.Linear(32, 8)
        expected = linear(norm(x))
        assert norm_offset(norm) == offset
        fold_scales(norm, [linear], 0.5 * 4 ** torch.rand(32, generator=generator), offset=offset)
        torch.testing.assert_close(linear(norm(x)), expected, rtol=1e-5, atol=1e-5)


def test_awq_checkpoint_reloads_in_transformers_with_our_numbers(
    saved_llama: tuple[Path, Path], tmp_path: Path, one_thread: None
) -> None:
    folder, data = saved_llama
    out = tmp_path / "awq"
    ours = compress(
        CompressRequest(
            str(folder), dataset=data, out_dir=None, samples=8, seq_len=64, method="awq",
            n_grid=4,
        )
    )  # fmt: skip
    streamed = compress(
        CompressRequest(
            str(folder), dataset=data, out_dir=out, samples=8, seq_len=64, method="awq",
            n_grid=4,
        )
    )  # fmt: skip
    unclipped = compress(
        CompressRequest(
            str(folder), dataset=data, out_dir=None, samples=8, seq_len=64, method="awq",
            n_grid=4, apply_clip=False,
        )
    )  # fmt: skip
    assert len(streamed.layers) == 14
    skipped = " ".join(streamed.stages[0].fallbacks)
    assert "grouped-query attention" in skipped  # the tiny Llama has 2 key/value heads of 4
    assert "different subgraphs" not in skipped  # every other pair was smoothed
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.as_tensor(np.load(data)[:4], dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=tokens).logits, ours.model(input_ids=tokens).logits,
            rtol=0, atol=1e-5,
        )  # fmt: skip
        # the checkpoint holds the clipped weights (o_proj, which no pair balances, too)
        for name in ("mlp.down_proj", "self_attn.o_proj"):
            clipped = ours.model.get_submodule(f"model.layers.0.{name}").weight
            plain = unclipped.model.get_submodule(f"model.layers.0.{name}").weight
            assert not torch.equal(clipped, plain)
        norm = reloaded.model.layers[0].input_layernorm.weight
        assert not torch.all(norm == 1)  # scales were folded into the norm (it starts at ones)


def test_smoothquant_stage_keeps_the_function_before_gptq_quantizes(
    saved_llama: tuple[Path, Path], one_thread: None
) -> None:
    folder, data = saved_llama
    smoothed = compress(
        CompressRequest(
            str(folder), dataset=data, samples=8, seq_len=64,
            stages=[Stage(method="smoothquant", smoothing_strength=0.8)],
        )
    )  # fmt: skip
    original = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = torch.as_tensor(np.load(data)[:2], dtype=torch.long)
    with torch.no_grad():
        got = smoothed.model.float()(input_ids=tokens).logits
        expected = original(input_ids=tokens).logits
    # bf16 storage rounds the folded weights: far below what quantizing changes
    assert float((got - expected).abs().max()) < 0.02 * float(expected.abs().max())
    changed = smoothed.model.model.layers[0].post_attention_layernorm.weight.float()
    assert not torch.allclose(changed, original.model.layers[0].post_attention_layernorm.weight)
    both = compress(
        CompressRequest(
            str(folder), dataset=data, samples=8, seq_len=64,
            stages=[Stage(method="smoothquant"), Stage(method="gptq", scheme="W8A8")],
        )
    )  # fmt: skip
    assert [s.stage.method for s in both.stages] == ["smoothquant", "gptq"]
    assert len(both.layers) == 14


def test_bad_smoothing_requests_say_what_to_do() -> None:
    with pytest.raises(BadInputError, match="only smooths"):
        Stage(method="smoothquant", scheme="W8A8")
    with pytest.raises(BadInputError, match="weights only"):
        Stage(method="awq", scheme="W8A8")
    with pytest.raises(BadInputError, match="outside"):
        Stage(method="smoothquant", smoothing_strength=1.5)
    with pytest.raises(BadInputError, match="clip_max_shrink"):
        Stage(method="awq", clip_max_shrink=1.0)


def test_a_checkpoint_of_smoothing_alone_is_refused(tmp_path: Path) -> None:
    """SmoothQuant quantizes nothing: alone, the checkpoint would be the model uncompressed
    (in memory, the smoothed model is returned as above)."""
    with pytest.raises(BadInputError, match="no stage quantizes or prunes") as refused:
        CompressRequest("llama", dataset="calib.npy", out_dir=tmp_path / "out",
                        stages=[Stage(method="smoothquant")])  # fmt: skip
    assert refused.value.param == "method" and "--recipe" in refused.value.hint
