"""Rules of twin, sample and config that hold for a family, each checked on the type that
showed it in ``coverage --all``: the shrunk config keeps the relations the full-size code relies
on (checked against the default config's own numbers), and the type verifies end to end.

Each sweep here is one tiny twin of one modality (a second or two), so the rules stay covered
even where the shipped sweep's CI re-verification would only say "this type broke".
"""

from __future__ import annotations

import copy

import pytest
import transformers

from llmc_trace.attempt.sweep_type import DEFAULT, _built_from, _config_of, resweep
from llmc_trace.models.defaults import default_config, generative_types
from llmc_trace.models.shrink import VOCAB_LIMIT, shrink_config
from llmc_trace.models.source import builtin_names_of_type, builtin_read_as
from tests.conftest import default_builds, shipped_types


def twin_config(model_type: str) -> transformers.PretrainedConfig:
    return shrink_config(copy.deepcopy(default_config(model_type)))


def test_heads_of_a_second_block_kind_shrink_with_the_main_ones() -> None:
    """GLM-5 Next's linear attention has as many heads as its full attention (64 each at full
    size): the twin keeps them equal, and its indexer's heads in their full-size proportion."""
    full = default_config("glm5_next").text_config
    twin = twin_config("glm5_next").text_config
    assert full.linear_num_heads == full.num_attention_heads
    assert twin.linear_num_heads == twin.num_attention_heads < full.num_attention_heads
    assert twin.index_n_heads * full.num_attention_heads == (
        full.index_n_heads * twin.num_attention_heads
    )


def test_per_layer_widths_and_vocabularies_shrink() -> None:
    """Gemma 3n's feed-forward width is a list with one entry per layer, and its per-layer
    embeddings have their own vocabulary: every entry narrows by one factor, to no more than
    twice the hidden size (from 8x), the twin of the twin is the twin, and the per-layer
    vocabulary is capped as the main one is."""
    full, twin = default_config("gemma3n_text"), twin_config("gemma3n_text")
    assert {width / full.hidden_size for width in full.intermediate_size} == {8}
    assert {width / twin.hidden_size for width in twin.intermediate_size} == {2}
    assert twin.hidden_size < full.hidden_size
    assert shrink_config(copy.deepcopy(twin)).to_dict() == twin.to_dict()
    assert full.vocab_size_per_layer_input > VOCAB_LIMIT >= twin.vocab_size_per_layer_input


def test_deepstack_layers_keep_their_count_in_the_twin_and_its_twin() -> None:
    """Qwen3-VL adds the states of three vision layers (of 27) to its first three decoder
    layers: the twin's tower keeps three such layers, its language model one plain layer and a
    last one after them, and a twin of the twin (what ``compress`` proves a saved twin on) is
    the twin, though its three indexes are as many as its tower's layers."""
    full, twin = default_config("qwen3_vl"), twin_config("qwen3_vl")
    count = len(full.vision_config.deepstack_visual_indexes)
    assert count == 3 and full.vision_config.depth > 3
    depth = twin.vision_config.depth
    assert twin.vision_config.deepstack_visual_indexes == list(range(depth - count, depth))
    assert twin.text_config.num_hidden_layers == count + 2
    again = shrink_config(copy.deepcopy(twin))
    assert again.vision_config.to_dict() == twin.vision_config.to_dict()
    assert again.text_config.num_hidden_layers == twin.text_config.num_hidden_layers


def test_an_odd_head_count_left_by_halving_becomes_four_heads() -> None:
    """Jais 2's 26 heads halve to 13: four heads, every width at the same 4/26 (its twin was
    114M parameters at 13 heads), and its MLP, 4.3x that width, then halved to 2x or less."""
    full, twin = default_config("jais2"), twin_config("jais2")
    assert twin.num_attention_heads == 4 and full.num_attention_heads == 26
    assert twin.hidden_size * 26 == full.hidden_size * 4
    assert twin.intermediate_size * 26 == full.intermediate_size  # 4/26 of it, halved twice
    assert twin.head_dim == full.head_dim


def test_widths_apart_from_the_heads_shrink_past_them() -> None:
    """Gemma 3's width is not its heads x head_dim: the twin keeps four heads of the full
    head_dim and shrinks the widths four times further (a tenth of the parameters), its MLP
    keeping its ratio to the width (halved, its 1,152 columns would no longer be groups of
    128). A mixture of experts (Gemma 4 26B-A4B) does not."""
    full, twin = default_config("gemma3_text"), twin_config("gemma3_text")
    assert full.num_attention_heads * full.head_dim != full.hidden_size
    assert (twin.num_attention_heads, twin.head_dim) == (4, full.head_dim)
    heads_ratio = twin.num_attention_heads / full.num_attention_heads
    assert twin.hidden_size == full.hidden_size * heads_ratio / 4
    assert twin.intermediate_size / twin.hidden_size == full.intermediate_size / full.hidden_size
    moe = "google/gemma-4-26B-A4B"
    full_moe = _config_of("gemma4", moe)().text_config
    twin_moe = shrink_config(_config_of("gemma4", moe)()).text_config
    moe_ratio = twin_moe.num_attention_heads / full_moe.num_attention_heads
    assert twin_moe.intermediate_size == full_moe.intermediate_size * moe_ratio


def test_an_audio_tokenizers_channels_start_small() -> None:
    """VibeVoice's acoustic tokenizer doubles 32 channels over six downsampling stages (2048
    at the last, 34M weights a convolution): the twin starts from 4, every stage kept."""
    full, twin = default_config("vibevoice"), twin_config("vibevoice")
    for key in ("audio_config", "semantic_model_config"):
        before, after = getattr(full, key), getattr(twin, key)
        assert before.num_filters == 32 and after.num_filters == 4
        assert after.downsampling_ratios == before.downsampling_ratios


def test_an_xlm_width_named_emb_dim_shrinks() -> None:
    """XLM names its width ``emb_dim`` (no other width key): it shrinks with the heads. Where
    ``emb_dim`` sits beside a ``hidden_size`` (Qwen2.5-Omni's DiT) it is left alone."""
    full, twin = default_config("xlm"), twin_config("xlm")
    assert twin.emb_dim * full.n_heads == full.emb_dim * twin.n_heads < full.emb_dim * full.n_heads
    omni = shrink_config(_config_of("qwen2_5_omni", DEFAULT)())
    assert omni.token2wav_config.dit_config.emb_dim == (
        default_config("qwen2_5_omni").token2wav_config.dit_config.emb_dim
    )


@shipped_types("muse_spark")
def test_a_layer_count_that_counts_stages_keeps_them() -> None:
    """Muse Spark's audio tower has one layer per stage (four widths, four layers): the twin
    keeps every stage, one block in each."""
    full = default_config("muse_spark").audio_config
    twin = twin_config("muse_spark").audio_config
    assert full.num_hidden_layers == len(full.hidden_sizes)
    assert twin.num_hidden_layers == len(twin.hidden_sizes) == len(full.hidden_sizes)
    assert set(twin.depths) == {1}


def test_merged_widths_follow_their_projector() -> None:
    """MiniMax-M3-VL's merged patch width is its projector's width times the merge squared."""
    full, twin = default_config("minimax_m3_vl"), twin_config("minimax_m3_vl")
    merge = full.vision_config.spatial_merge_size
    assert full.merged_hidden_size == full.projector_hidden_size * merge**2
    assert twin.merged_hidden_size == twin.projector_hidden_size * merge**2
    assert twin.projector_hidden_size < full.projector_hidden_size


def test_a_composites_projector_width_shrinks_with_its_text_model() -> None:
    """Cohere2-Vision's projector widens to 36,864 between its towers, a field of the composite
    config itself: the twin's keeps its full-size ratio to the text width (kept, it was 85 % of
    the twin's weights)."""
    full, twin = default_config("cohere2_vision"), twin_config("cohere2_vision")
    assert twin.text_config.hidden_size < full.text_config.hidden_size
    assert twin.alignment_intermediate_size * full.text_config.hidden_size == (
        full.alignment_intermediate_size * twin.text_config.hidden_size
    )


@shipped_types("apertus1p5")
def test_media_codes_stay_inside_the_shrunk_vocabulary() -> None:
    """Apertus 1.5 embeds image and audio codes as token ids from an offset per medium: in the
    twin every code of each codebook is a token id of its vocabulary, the two ranges apart and
    clear of the special ids."""
    full, twin = default_config("apertus1p5"), twin_config("apertus1p5")
    assert full.audio_token_offset + full.audio_config.codebook_size <= full.text_config.vocab_size
    vocab = twin.text_config.vocab_size
    image = range(
        twin.image_token_offset, twin.image_token_offset + twin.vision_config.codebook_size
    )
    audio = range(
        twin.audio_token_offset, twin.audio_token_offset + twin.audio_config.codebook_size
    )
    assert vocab == VOCAB_LIMIT and image.stop <= audio.start and audio.stop <= vocab
    specials = {twin.image_token_id, twin.audio_token_id, twin.text_config.pad_token_id}
    assert not specials & (set(image) | set(audio))


@default_builds("musicgen")
def test_a_class_is_built_from_the_sub_config_of_its_own_config_class() -> None:
    """MusicGen's causal LM is its composite's decoder; Qwen2.5-Omni's thinker is the published
    Omni config's thinker_config, so that built-in serves the thinker's type."""
    musicgen = _built_from(default_config("musicgen"), transformers.MusicgenForCausalLM)
    assert isinstance(musicgen, transformers.MusicgenDecoderConfig)
    assert "Qwen/Qwen2.5-Omni-3B" in builtin_names_of_type("qwen2_5_omni_thinker")


def test_a_built_in_is_read_as_the_sibling_type_its_sources_name() -> None:
    """Ministral-8B's published config says ``mistral``; transformers' ``MinistralConfig`` names
    that checkpoint as its own, so ``SOURCES.json`` lets the ministral sweep read it: the
    published values in ``MinistralConfig``, while the mistral sweep still reads it as
    ``MistralConfig``. Every type a built-in is read as is one transformers knows."""
    name = "mistralai/Ministral-8B-Instruct-2410"
    assert name in builtin_names_of_type("ministral") and name in builtin_names_of_type("mistral")
    ministral = _config_of("ministral", name)()
    assert type(ministral) is transformers.MinistralConfig
    assert (ministral.head_dim, ministral.sliding_window, ministral.num_hidden_layers) == (
        128,
        32768,
        36,
    )
    assert type(_config_of("mistral", name)()) is transformers.MistralConfig
    assert set(builtin_read_as()) <= set(transformers.CONFIG_MAPPING)


def test_blt_global_width_is_its_patches_of_local_states() -> None:
    """BLT's global transformer reads patches of ``cross_attn_k`` local encoder states: at full
    size 2048 = 1024 x 2, and the twin keeps the relation, the local configs' view of the
    global width with it."""
    for config in (default_config("blt"), twin_config("blt")):
        width = config.global_config.hidden_size
        assert width == config.encoder_config.hidden_size * config.cross_attn_k
        assert config.encoder_config.hidden_size_global == width
        assert config.decoder_config.hidden_size_global == width


def test_a_twin_layer_the_model_init_leaves_alone_still_gets_drawn() -> None:
    """Linear layers are made zero and drawn by the model's own init; one the init leaves alone
    gets torch's draw after, one it drew keeps the model's values."""
    import torch

    from llmc_trace.models.build import _initialized_once

    with _initialized_once():
        left = torch.nn.Linear(8, 8)
        drawn = torch.nn.Linear(8, 8)
        assert not left.weight.any() and not drawn.weight.any()
        torch.nn.init.constant_(drawn.weight, 0.5)
    assert left.weight.any() and left.weight.abs().max() <= 8**-0.5
    assert bool((drawn.weight == 0.5).all())
    assert torch.nn.Linear(2, 2).weight.any()  # torch's own draw is back


@pytest.mark.usefixtures("one_thread")  # as in the sweep's workers
@pytest.mark.parametrize(
    ("model_type", "config", "modalities"),
    [
        # audio codes, a row per codebook
        pytest.param("musicgen", DEFAULT, ["text"], marks=default_builds("musicgen")),
        ("fun_asr_nano", DEFAULT, ["audio"]),  # mel frames stacked seven to a frame
        pytest.param("muse_spark", DEFAULT, ["audio"], marks=shipped_types("muse_spark")),
        ("minimax_m3_vl", DEFAULT, ["image"]),
        ("cohere2_vision", DEFAULT, ["image"]),  # a projector width of the composite's own
        # VQ and audio codes as token ids
        pytest.param("apertus1p5", DEFAULT, ["audio", "image"], marks=shipped_types("apertus1p5")),
        ("qwen2_5_omni_thinker", "Qwen/Qwen2.5-Omni-3B", ["text"]),
        ("blt", DEFAULT, ["text"]),
        ("xmod", DEFAULT, ["text"]),  # each sequence's language
        ("idefics", DEFAULT, ["image"]),  # pictures read by cross-attention
        ("voxtral_realtime", DEFAULT, ["audio"]),  # one encoder row per token
        # published configs of a sibling type, read as the type (SOURCES.json's read_as)
        ("ministral", "mistralai/Ministral-8B-Instruct-2410", ["text"]),
        ("glm46v", "zai-org/GLM-4.6V-Flash", ["image", "text", "video"]),
        ("glmga", "zai-org/GLM-4.6V-Flash", ["image"]),
        ("instructblipvideo", "Salesforce/instructblip-flan-t5-xl", ["image"]),
    ],
)
def test_the_family_verifies(model_type: str, config: str, modalities: list[str]) -> None:
    rows = resweep(model_type, generative_types()[model_type], config, modalities)
    outcomes = sorted((r.modality, r.outcome) for r in rows)
    assert outcomes == [(m, "verified") for m in sorted(modalities)], [r.problem for r in rows]
