"""Shrink a config into a *tiny twin*: the same architecture and code paths, small sizes.

Verification runs real numbers, so it needs real (random) weights; a 70B config cannot
provide them, its twin can. Widths are divided by one power-of-two factor per config, chosen
so that at least four attention heads remain; a head count that no power of two divides
(Falcon-7B's 71), or that halves to an odd eight or more (Jais 2's 26 to 13), becomes four
heads, every width scaled by the same ratio. A dense config whose heads are already apart
from its width (Gemma's ``head_dim``: 8 heads of 256 in a 2560 width) shrinks its widths up
to 4x further than its heads, and a feed-forward width more than twice its config's width
halves until it is not (most of a twin's weights were its MLP's). Head dimensions, rope
sections, patch sizes and every ratio the code relies on are kept, which is what keeps the
twin on the same code paths. Layer counts shrink to the shortest prefix that still holds
every distinct layer type (dense and MoE, sliding and full attention, attention and SSM).
Vocabularies shrink too, with special token ids moved inside the smaller vocabulary, and
convolutional tokenizers start from few channels.

Fields of one sub-config that mirror another's width (a vision tower's output size equal to
the text hidden size) follow that width, so projections still line up.
"""

from __future__ import annotations

import copy
import math
import re
from fractions import Fraction
from typing import Any

from transformers import PretrainedConfig

HEAD_KEYS = (
    "num_attention_heads",
    "n_head",
    "num_heads",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "n_heads",
    "attention_heads",
)
KV_HEAD_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
WIDTH_KEYS = (
    "hidden_size",
    "d_model",
    "n_embd",
    "embed_dim",
    "dim",
    "width",
    "intermediate_size",
    "ffn_dim",
    "d_ff",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "n_inner",
    "ffn_hidden_size",
    "mlp_dim",
    "mamba_n_heads",
    "decoder_hidden_size",
    "projector_hidden_size",
    "out_hidden_size",
    "vision_output_dim",
    "hidden_dim",
    "expert_intermediate_size",
    "intermediate_size_mlp",
    "text_hidden_size",
    "mamba_expand_size",
    "attention_hidden_size",
    "lru_width",
    "embedding_dim",  # xLSTM
    "merged_hidden_size",  # MiniMax-M3-VL's merged patches, followed by _follow_merged_widths
)
LAYER_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
    "depth",
    "num_encoder_layers",
    "num_global_layers",
    "num_blocks",  # xLSTM
    "num_layers_per_stack",  # HRM's stacks, each this deep
)
LAYER_LIST_KEYS = (
    "layer_types",
    "layers_block_type",
    "block_types",
    "layers_type",
    "hybrid_override_pattern",
    "mlp_layer_types",
)
#: Lists of layer indexes that :func:`_retarget_feature_layers` points into the twin's tower:
#: never one entry per layer, whatever their length (a twin's three deepstack layers of three).
LAYER_INDEX_KEYS = frozenset({"deepstack_visual_indexes"})
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = (
    "num_experts_per_tok",
    "top_k",
    "moe_topk",
    "num_experts_per_token",
    "top_k_experts",  # Gemma 4
    "moe_k",  # ERNIE 4.5
)
#: Keys naming a config's model width, the first present read; ``emb_dim`` only where no
#: other is (see :func:`_width_keys`).
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "width", "emb_dim")
#: The narrowest width :func:`_decoupled_ratio` shrinks to.
DECOUPLED_MIN_WIDTH = 256
VOCAB_LIMIT = 1024
EXPERTS = 4
MIN_LAYERS = 2
#: Heads kept per attention block: some models split heads four ways (CodeGen's ``mp_num``).
MIN_HEADS = 4


def shrink_config(config: PretrainedConfig, min_layers: int = MIN_LAYERS) -> PretrainedConfig:
    """Return the tiny twin's config; ``config`` itself is left untouched.

    ``min_layers`` keeps at least that many layers in the text stack (two groups of targets
    when several targets share a subgraph, so the twin has the full model's group shape).
    """
    twin = copy.deepcopy(config)
    renamed_widths: dict[int, int] = {}
    text = _text_config(twin)
    for sub in [text, *[c for c in _sub_configs(twin) if c is not text]]:
        _shrink_one(sub, renamed_widths, min_layers if sub is text else MIN_LAYERS)
    for sub in [twin, *_sub_configs(twin)]:
        _follow_widths(sub, renamed_widths)
    _follow_merged_widths(twin, renamed_widths)
    _shrink_projector_widths(twin, config)
    _narrow_feed_forward(twin)
    _shrink_vocab(twin)
    _shrink_images(twin)
    _shrink_conv_towers(twin)
    _keep_deepstack(twin, config)
    _retarget_feature_layers(twin)
    _derive_again(twin)
    return twin


def _sub_configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    found = []
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found.append(value)
            found.extend(_sub_configs(value))
    return found


def _text_config(config: PretrainedConfig) -> PretrainedConfig:
    for key in ("text_config", "language_config", "llm_config", "decoder"):
        value = getattr(config, key, None)
        if isinstance(value, PretrainedConfig):
            return value
    return config


def _get(config: PretrainedConfig, keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for key in keys:
        value = vars(config).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def _width_ratio(config: PretrainedConfig) -> Fraction:
    """What every width of ``config`` is multiplied by: ``1/2**k``, or ``4/heads`` when the
    powers of two leave at least eight heads (an odd count) and that ratio keeps every width
    whole."""
    heads = _get(config, HEAD_KEYS)
    hidden = _get(config, HIDDEN_KEYS)
    factor = 1
    while True:
        nxt = factor * 2
        if heads is not None and (heads[1] % nxt or heads[1] // nxt < MIN_HEADS):
            break
        if hidden is None or hidden[1] % nxt or hidden[1] // nxt < 64:
            break
        factor = nxt
    power = Fraction(1, factor)
    if heads is None or hidden is None or heads[1] // factor < 2 * MIN_HEADS:
        return power
    # an odd head count left (Jais 2's 26 heads halve to 13): four heads where every width
    # stays whole at that ratio
    ratio = Fraction(MIN_HEADS, heads[1])
    return ratio if _whole_at(config, ratio) and hidden[1] * ratio >= 64 else power


def _width_keys(config: PretrainedConfig) -> tuple[str, ...]:
    """:data:`WIDTH_KEYS`, and ``emb_dim`` where it is the config's width (XLM's, FlauBERT's:
    no other key names one). Elsewhere it is one block's own size (Qwen2.5-Omni's DiT beside
    its ``hidden_size``), which is left as it is."""
    hidden = _get(config, HIDDEN_KEYS)
    return (*WIDTH_KEYS, "emb_dim") if hidden is not None and hidden[0] == "emb_dim" else WIDTH_KEYS


def _whole_at(config: PretrainedConfig, ratio: Fraction) -> bool:
    """Whether every width of ``config`` (one per layer included) stays whole at ``ratio``."""
    attrs = vars(config)
    return all(
        (v * ratio).denominator == 1 for key in _width_keys(config) for v in _counts(attrs.get(key))
    )


def _decoupled_ratio(config: PretrainedConfig, ratio: Fraction) -> Fraction:
    """A further shrink of the widths alone where the published config already sets its
    attention apart from its width (``head_dim`` given, heads x head_dim not the hidden size:
    Gemma's 8 heads of 256 in a 2560 width): its code projects between the two, so the width
    can shrink past where the heads stop (four heads of 256 kept a 1152 width and a 4608 MLP,
    most of the twin). Down to a width of :data:`DECOUPLED_MIN_WIDTH`, by at most 4."""
    heads, hidden = _get(config, HEAD_KEYS), _get(config, HIDDEN_KEYS)
    head_dim = vars(config).get("head_dim")
    if (
        heads is None
        or hidden is None
        or not _is_count(head_dim)
        or heads[1] * head_dim == hidden[1]
        or _get(config, EXPERT_KEYS) is not None  # a mixture of experts' widths stay as they are
    ):
        return Fraction(1)
    extra = 1
    while extra < 4:
        nxt = Fraction(ratio, extra * 2)
        if hidden[1] * nxt < DECOUPLED_MIN_WIDTH or not _whole_at(config, nxt):
            break
        extra *= 2
    return Fraction(1, extra)


def _counts(value: Any) -> list[int]:
    """A width field's values: one, one per layer, or none."""
    if _is_count(value):
        return [value]
    return list(value) if _is_counts(value) else []


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_counts(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(_is_count(v) for v in value)


def _shrink_one(config: PretrainedConfig, renamed: dict[int, int], min_layers: int) -> None:
    attrs = vars(config)
    ratio = _width_ratio(config)
    head_dim = attrs.get("head_dim")
    heads = _get(config, HEAD_KEYS)
    if (
        heads
        and attrs.get("head_dim") is None
        and "hidden_size" in attrs
        and isinstance(attrs["hidden_size"], int)
    ):
        head_dim = attrs["hidden_size"] // heads[1]
    widths = ratio * _decoupled_ratio(config, ratio)
    if widths < 1:
        for key in _width_keys(config):
            value = attrs.get(key)
            if _is_counts(value) and all(v * widths >= 1 for v in value):
                # one width per layer (Gemma 3n's intermediate_size): each shrinks alike
                shrunk = (renamed.setdefault(v, int(v * widths)) for v in value)
                setattr(config, key, type(value)(shrunk))
                continue
            if not _is_count(value) or value * widths < 1:
                continue
            if value in renamed:  # mirrors a width already shrunk (a tower's output = text width)
                setattr(config, key, renamed[value])
            else:
                renamed[value] = int(value * widths)
                setattr(config, key, renamed[value])
    if ratio < 1:
        for key in (*HEAD_KEYS, *KV_HEAD_KEYS, "n_groups"):
            if isinstance(attrs.get(key), int):
                setattr(config, key, max(1, int(attrs[key] * ratio)))
        for key in _more_widths_and_heads(config):
            setattr(config, key, max(1, int(attrs[key] * ratio)))
        if head_dim is not None and attrs.get("head_dim") is not None:
            config.head_dim = head_dim
    _shrink_layers(config, min_layers)
    _shrink_experts(config)


#: Head counts and feed-forward widths of a block's second kind, named after it (GLM-5 Next's
#: ``linear_num_heads`` and its indexer's ``index_n_heads``, Qwen3-Next's
#: ``linear_num_key_heads``, a merger's ``projection_intermediate_size``, LongCat-Flash's
#: ``expert_ffn_hidden_size``): they scale with the config's widths as the main ones do.
_OTHER_HEADS = re.compile(
    r"^((\w+_)?num_(\w+_)?heads|\w+_n_heads|\w+_intermediate_size|\w+_ffn_hidden_size)$"
)


def _more_widths_and_heads(config: PretrainedConfig) -> list[str]:
    """Fields :data:`_OTHER_HEADS` names that the key lists above do not."""
    known = {*WIDTH_KEYS, *HEAD_KEYS, *KV_HEAD_KEYS}
    return [
        key
        for key, value in vars(config).items()
        if key not in known and _OTHER_HEADS.match(key) and _is_count(value) and value > 1
    ]


def _shrink_layers(config: PretrainedConfig, min_layers: int) -> None:
    attrs = vars(config)
    keep = min_layers
    for key, value in list(attrs.items()):
        is_depths = key.endswith("depths") and isinstance(value, (list, tuple))
        if is_depths and all(_is_count(depth) for depth in value):
            # blocks per stage of a convolutional or hierarchical tower: one block runs every
            # stage's code, and the stage count (each stage's width) stays, also where a layer
            # count counts the stages (Muse Spark's audio tower: four stages, num_hidden_layers 4)
            setattr(config, key, type(value)([1] * len(value)))
            if any(attrs.get(k) == len(value) for k in LAYER_KEYS):
                keep = max(keep, len(value))
    dense_first = attrs.get("first_k_dense_replace")
    if isinstance(dense_first, int) and dense_first > 0:
        config.first_k_dense_replace = 1
        keep = max(keep, 2)
        kinds = attrs.get("mlp_layer_types")
        if isinstance(kinds, list) and len(kinds) > dense_first:
            # GLM-5 derives its per-layer MLP kinds from first_k_dense_replace when the config
            # is made, then reads only the kinds: one dense layer left, as the count says
            config.mlp_layer_types = kinds[dense_first - 1 :]
    for key in LAYER_LIST_KEYS:
        pattern = attrs.get(key)
        if isinstance(pattern, (list, str)) and len(pattern) > 0:
            kinds = list(dict.fromkeys(pattern))
            prefix = max(pattern.index(kind) for kind in kinds) + 1
            keep = max(keep, prefix)
    for key in (
        "attn_layer_period",
        "expert_layer_period",
        "full_attention_interval",
        "sliding_window_pattern",
        "decoder_sparse_step",
        "interleave_moe_layer_step",
        "cross_attention_layers_period",
    ):
        period = attrs.get(key)
        if isinstance(period, int) and period > 1:
            keep = max(keep, period + (attrs.get("attn_layer_offset", 0) or 0) % period + 1)
    rescale = attrs.get("rescale_every")
    if isinstance(rescale, int) and rescale >= 2:
        # RWKV halves its hidden state after every `rescale_every`-th block and rescales the
        # weights from there on: the twin has blocks with and without, and a halving in its last
        config.rescale_every = 2
        keep = max(keep, 4)
    cross = attrs.get("cross_attention_layers")
    if isinstance(cross, list) and cross:
        config.cross_attention_layers = [1]
        keep = max(keep, 3)
    for key, indices in list(attrs.items()):
        # layers tapped for features (Mllama's intermediate_layers_indices): their count shapes
        # projections, so keep as many, renumbered inside the shortened stack
        if key.endswith("layers_indices") and isinstance(indices, list) and indices:
            keep = max(keep, len(indices))
            setattr(config, key, list(range(len(indices))))
    windows = attrs.get("global_attn_indexes")
    if isinstance(windows, (list, tuple)) and windows and all(_is_count(i) for i in windows):
        # SAM's windowed layers and its first global one, whose hidden state DeepSeek-VL's
        # hybrid tower reads: kept with one layer after it
        keep = max(keep, windows[0] + 2)
        config.global_attn_indexes = type(windows)(i for i in windows if i < keep)
    shared = attrs.get("num_kv_shared_layers")
    if _is_count(shared) and shared > 0:
        # the last layers reuse the caches of earlier layers of their type (Gemma 3n): the twin
        # keeps producers of every type, then as many consumers
        config.num_kv_shared_layers = min(shared, keep)
        keep += config.num_kv_shared_layers
    depth = next(
        (v for k in LAYER_KEYS if isinstance(v := attrs.get(k), int) and not isinstance(v, bool)),
        None,
    )
    for key in LAYER_KEYS:
        value = attrs.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > keep:
            setattr(config, key, keep)
    if depth is not None and depth > keep:
        _shorten_per_layer(config, depth, keep)
    for key in LAYER_LIST_KEYS:
        pattern = attrs.get(key)
        if isinstance(pattern, (list, str)) and len(pattern) > keep:
            setattr(config, key, pattern[:keep])
    for key in ("mlp_only_layers", "attn_layer_indices", "full_attn_idxs"):
        indices = attrs.get(key)
        if isinstance(indices, list):
            setattr(config, key, [i for i in indices if isinstance(i, int) and i < keep])


def _shorten_per_layer(config: PretrainedConfig, depth: int, keep: int) -> None:
    """Per-layer settings cut to the ``keep`` layers left: a list with one entry per layer
    (Laguna's ``num_attention_heads_per_layer``, GLM-5's ``mlp_layer_types``) and a mapping
    from layer index (Gemma 4's ``per_layer_config``). transformers validates them against the
    layer count when the twin is saved or loaded, though building it reads only what it uses."""
    for key, value in list(vars(config).items()):
        if key in LAYER_LIST_KEYS or key in LAYER_INDEX_KEYS:
            continue
        if isinstance(value, list) and len(value) == depth:
            setattr(config, key, value[:keep])
        elif isinstance(value, dict) and value and all(isinstance(k, int) for k in value):
            setattr(config, key, {k: v for k, v in value.items() if k < keep})


def _shrink_experts(config: PretrainedConfig) -> None:
    attrs = vars(config)
    experts = _get(config, EXPERT_KEYS)
    if experts is None or experts[1] <= EXPERTS:
        return
    for key in EXPERT_KEYS:  # some configs name the count twice; the model may read either
        if isinstance(attrs.get(key), int):
            setattr(config, key, EXPERTS)
    for key in TOP_K_KEYS:
        if isinstance(attrs.get(key), int) and attrs[key] > 2:
            setattr(config, key, 2)
    for key in ("n_group", "num_expert_group"):  # expert groups (Bailing names them so)
        if isinstance(attrs.get(key), int):
            setattr(config, key, 1)
    if isinstance(attrs.get("topk_group"), int):
        config.topk_group = 1


_SIZE_NAME = re.compile(r"(dim|size|hidden|width)")
_NOT_A_WIDTH = re.compile(
    r"(vocab|position|max_|window|patch|image|chunk|kernel|conv|state|"
    r"bucket|rope|sliding|token|length|group_size|num_|head_dim)"
)


def _follow_widths(config: PretrainedConfig, renamed: dict[int, int]) -> None:
    """Size fields equal to a width divided elsewhere follow it (projections, embedding dims).

    OPT's ``word_embed_proj_dim`` equal to ``hidden_size`` means "no projection"; left at the
    old width, the twin would grow a projection the real model does not have.
    """
    for key, value in list(vars(config).items()):
        if _is_split_of_width(key, value, renamed):
            # a width split into parts (Reformer's axial_pos_embds_dim sums to hidden_size):
            # every part shrinks by the width's ratio
            ratio = Fraction(renamed[sum(value)], sum(value))
            parts = [part * ratio for part in value]
            if all(part.denominator == 1 for part in parts):
                setattr(config, key, type(value)(int(part) for part in parts))
            continue
        if _is_channels_into_width(key, value, renamed):
            # convolutions stepping up to a width shrunk elsewhere (Unlimited OCR's SAM neck
            # into its CLIP encoder): each step that is a renamed width follows it
            setattr(config, key, type(value)(renamed.get(v, v) for v in value))
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value not in renamed:
            continue
        # a depthwise convolution's groups equal its channels (Mimi's upsample_groups)
        if _names_a_size(key) or key.endswith("_groups"):
            if renamed[value] != value:
                setattr(config, key, renamed[value])


def _follow_merged_widths(config: PretrainedConfig, renamed: dict[int, int]) -> None:
    """Top-level widths of merged patches follow their tower: Muse's ``out_hidden_size`` is
    the vision width times its ``merge_size`` squared (the patches one token merges), so the
    twin's is its smaller tower's width times the same."""
    merges = {
        m
        for sub in _sub_configs(config)
        for key in ("spatial_merge_size", "merge_size")
        if _is_count(m := vars(sub).get(key)) and m > 1
    }
    for key in WIDTH_KEYS:
        value = vars(config).get(key)
        if not _is_count(value) or value in renamed:
            continue
        merged = [
            new * m * m for old, new in renamed.items() for m in merges if old * m * m == value
        ]
        if merged:
            setattr(config, key, merged[0])


#: A composite's own widths, inside the projector between its towers and its text model:
#: Cohere2-Vision's and Aya Vision's 36,864 / 28,672 (85 % of their twins' weights when kept),
#: LFM2-VL's ``projector_hidden_size``.
PROJECTOR_WIDTH_KEYS = ("alignment_intermediate_size", "projector_hidden_size")


def _shrink_projector_widths(twin: PretrainedConfig, full: PretrainedConfig) -> None:
    """:data:`PROJECTOR_WIDTH_KEYS` of a composite config (whose own fields are not shrunk as
    a sub-config's are) by its text model's width ratio, where they stay whole; one that
    already followed a width elsewhere is left as it is."""
    text = _text_config(twin)
    hidden, full_hidden = _get(text, HIDDEN_KEYS), _get(_text_config(full), HIDDEN_KEYS)
    if text is twin or hidden is None or full_hidden is None or hidden[1] >= full_hidden[1]:
        return
    ratio = Fraction(hidden[1], full_hidden[1])
    for key in PROJECTOR_WIDTH_KEYS:
        value = vars(twin).get(key)
        if _is_count(value) and value == vars(full).get(key) and (value * ratio).denominator == 1:
            setattr(twin, key, int(value * ratio))


#: Feed-forward widths: each sizes an MLP's matrices (and its experts'), which nothing in a
#: forward branches on, and they are most of a twin's weights (a 2,048-wide twin of a 16,384
#: MLP holds 25 M weights per layer in it).
FEED_FORWARD_KEYS = (
    "intermediate_size",
    "ffn_dim",
    "d_ff",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "n_inner",
    "ffn_hidden_size",
    "mlp_dim",
    "intermediate_size_mlp",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "expert_intermediate_size",
    "shared_intermediate_size",  # Granite 4's shared MLP beside its experts
)
#: The largest group size a scheme splits input columns into (W4A16's).
GROUP_MULTIPLE = 128


def _narrow_feed_forward(twin: PretrainedConfig) -> None:
    """Halve each feed-forward width (every entry of a per-layer one alike) while it is wider
    than twice its config's width (:func:`_halved`): the matrices narrow, the code paths stay,
    and the twin of a twin is the twin. A width that another field mirrors (a tower's width
    equal to a text MLP's, a projection sized to it) is left as it is, so the two still line
    up; so is one no wider than twice the width, which SSM blocks size from their width
    (Mamba's ``intermediate_size`` is its expansion of it)."""
    configs = [twin, *_sub_configs(twin)]
    mirrored = {
        v
        for config in configs
        for key, value in vars(config).items()
        if key not in FEED_FORWARD_KEYS and _names_a_size(key)
        for v in _counts(value)
    }
    for config in configs:
        hidden = _get(config, HIDDEN_KEYS)
        if hidden is None:
            continue
        for key in FEED_FORWARD_KEYS:
            value = vars(config).get(key)
            widths = _counts(value)
            if mirrored.intersection(widths):
                continue
            narrowed = _halved(widths, hidden[1])
            if narrowed != widths:
                setattr(config, key, narrowed[0] if _is_count(value) else type(value)(narrowed))


def _halved(widths: list[int], width: int) -> list[int]:
    """``widths`` halved together while each is wider than twice ``width`` and stays a
    multiple of what it was of :data:`GROUP_MULTIPLE` (the group sizes a scheme divides it
    into keep dividing it)."""
    groups = [math.gcd(w, GROUP_MULTIPLE) for w in widths]
    while widths and all(
        w > 2 * width and w // 2 % g == 0 for w, g in zip(widths, groups, strict=True)
    ):
        widths = [w // 2 for w in widths]
    return widths


def _names_a_size(key: str) -> bool:
    """Whether ``key`` may hold a width (a size, dimension or hidden width, not a count of
    positions, tokens or heads)."""
    return key in WIDTH_KEYS or bool(_SIZE_NAME.search(key) and not _NOT_A_WIDTH.search(key))


def _is_channels_into_width(key: str, value: Any, renamed: dict[int, int]) -> bool:
    return (
        key.endswith("_channels")
        and isinstance(value, (list, tuple))
        and bool(value)
        and all(_is_count(v) for v in value)
        and value[-1] in renamed
    )


def _is_split_of_width(key: str, value: Any, renamed: dict[int, int]) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) > 1
        and all(type(part) is int for part in value)
        and sum(value) in renamed
        and bool(_SIZE_NAME.search(key))
        and not _NOT_A_WIDTH.search(key)
    )


def _is_token_field(key: str) -> bool:
    return key.endswith(("_token_id", "_token_index", "_token_ids"))


def _shrink_vocab(config: PretrainedConfig) -> None:
    """Cap vocabularies at :data:`VOCAB_LIMIT`, moving special ids that fall outside inside it.

    The move is applied to every (sub-)config, since a VLM keeps its image token id at the top
    level while the vocabulary lives in the text config.
    """
    configs = [config, *_sub_configs(config)]
    limit = None
    for sub in configs:
        for key, vocab in list(vars(sub).items()):
            # every table indexed by ids: vocab_size, and src_/tgt_vocab_size (FSMT), hash
            # n-gram vocabularies (BLT's 500002 rows, six tables of them), ...
            # Gemma 3n's per-layer embeddings: vocab_size_per_layer_input rows
            is_vocabulary = key.endswith(("vocab_size", "_vocab")) or key.startswith("vocab_size_")
            if is_vocabulary and type(vocab) is int and vocab > VOCAB_LIMIT:
                setattr(sub, key, VOCAB_LIMIT)
                limit = VOCAB_LIMIT
    if limit is None:
        return
    moved: dict[int, int] = {}
    for sub in configs:
        for key in sorted(vars(sub)):
            if not _is_token_field(key):
                continue
            value = vars(sub)[key]
            tokens = value if isinstance(value, list) else [value]
            for token in tokens:
                if isinstance(token, int) and token >= limit and token not in moved:
                    moved[token] = limit - 1 - len(moved)
    for sub in configs:
        for key in list(vars(sub)):
            if not _is_token_field(key):
                continue
            value = vars(sub)[key]
            if isinstance(value, list):
                setattr(sub, key, [moved.get(t, t) if isinstance(t, int) else t for t in value])
            elif isinstance(value, int):
                setattr(sub, key, moved.get(value, value))
    _place_code_ranges(config, configs, limit, len(moved))


def _place_code_ranges(
    config: PretrainedConfig, configs: list[PretrainedConfig], limit: int, specials: int
) -> None:
    """Discrete media tokens inside the shrunk vocabulary: a medium's codes are ids from
    ``<medium>_token_offset`` on, one per entry of its tokenizer's codebook (Apertus 1.5's
    image and audio codes after the text's). The offsets move into the upper half of the
    vocabulary, below the special ids moved to its top, each with a range its codebook
    (shrunk to fit) cannot leave."""
    found = {
        key: value
        for key, value in vars(config).items()
        if key.endswith("_token_offset") and _is_count(value) and value >= limit
    }
    offsets = sorted(found, key=found.__getitem__)  # in their full-size order
    if not offsets:
        return
    start, end = limit // 2, limit - max(specials, 32)
    span = (end - start) // len(offsets)
    for index, key in enumerate(offsets):
        setattr(config, key, start + index * span)
    for sub in configs:
        size = vars(sub).get("codebook_size")
        if _is_count(size) and size > span:
            sub.codebook_size = span


#: Patches per image side in a twin: divisible by 2, 3, 4 and 6, the merge, pixel-shuffle and
#: pooling factors vision-language models use.
TWIN_PATCHES_PER_SIDE = 12
#: Learned image queries a twin keeps (Kosmos-2's count): each becomes a placeholder token.
LATENT_QUERIES = 64


def _shrink_images(config: PretrainedConfig) -> None:
    """Small images for twins: a 896-pixel SigLIP input would dominate verification time.

    Fields derived from the image size follow: Gemma 3 pools to ``mm_tokens_per_image`` soft
    tokens (kept a square dividing the patch grid), Idefics3 records its ``image_seq_len``, and
    an any-resolution model's ``image_grid_pinpoints`` (resolutions in multiples of the tower's
    image size) scale with it, so that a picture is cut into as many tiles as at full size.
    """
    ratio = None
    for sub in [config, *_sub_configs(config)]:
        attrs = vars(sub)
        size, patch = attrs.get("image_size"), attrs.get("patch_size")
        if (
            isinstance(size, int)
            and isinstance(patch, int)
            and size // patch > TWIN_PATCHES_PER_SIDE
        ):
            sub.image_size = patch * TWIN_PATCHES_PER_SIDE
            ratio = ratio or Fraction(sub.image_size, size)
    attrs = vars(config)
    if _is_count(attrs.get("latent_query_num")) and attrs["latent_query_num"] > LATENT_QUERIES:
        # Kosmos-2.5's 2048 image queries each take a placeholder: 2048 tokens of text per image
        config.latent_query_num = LATENT_QUERIES
    pinpoints = attrs.get("image_grid_pinpoints")
    if ratio is not None and isinstance(pinpoints, list) and pinpoints:
        scaled = [[side * ratio for side in point] for point in pinpoints]
        if all(side.denominator == 1 for point in scaled for side in point):
            config.image_grid_pinpoints = [[int(side) for side in point] for point in scaled]
    queries = attrs.get("projector_patch_to_query_dict")
    if ratio is not None and isinstance(queries, dict) and queries:
        # Aria's query count per patch count: the patch counts of the sizes it was trained at
        scaled_keys = {int(k) * ratio * ratio: v for k, v in queries.items()}
        if all(k.denominator == 1 for k in scaled_keys):
            config.projector_patch_to_query_dict = {int(k): v for k, v in scaled_keys.items()}
    for sub in [config, *_sub_configs(config)]:  # T5Gemma 2 keeps it in its encoder's config
        if isinstance(vars(sub).get("mm_tokens_per_image"), int):
            sub.mm_tokens_per_image = 16  # 4 x 4 pooled tokens, from a 12 x 12 patch grid
    scale = attrs.get("scale_factor")
    if isinstance(attrs.get("image_seq_len"), int) and isinstance(scale, int) and scale > 0:
        config.image_seq_len = (TWIN_PATCHES_PER_SIDE // scale) ** 2


#: Channels of a convolutional image tokenizer's first stage in a twin: GroupNorm's 32 groups.
CONV_BASE_CHANNELS = 32
#: Channels a convolutional audio tokenizer's first stage keeps (each later stage doubles them).
CONV_AUDIO_FILTERS = 4


def _shrink_conv_towers(config: PretrainedConfig) -> None:
    """A convolutional image tokenizer (a VQ-GAN encoder: ``base_channels`` times each stage's
    multiplier, ``num_res_blocks`` per stage) with its narrowest channels and one block per
    stage: at 256 channels its convolutions cost more than the rest of the twin together.
    Likewise a convolutional audio tokenizer whose ``num_filters`` channels double at each
    downsampling stage (VibeVoice's: 32 become 2048 over six stages, 34M weights a convolution)
    starts from :data:`CONV_AUDIO_FILTERS`."""
    for sub in [config, *_sub_configs(config)]:
        attrs = vars(sub)
        if _is_count(attrs.get("base_channels")) and _is_count(attrs.get("num_res_blocks")):
            sub.base_channels = min(sub.base_channels, CONV_BASE_CHANNELS)
            sub.num_res_blocks = 1
        stages = attrs.get("downsampling_ratios")
        if _is_count(attrs.get("num_filters")) and _is_counts(stages):
            sub.num_filters = min(sub.num_filters, CONV_AUDIO_FILTERS)


def _retarget_feature_layers(config: PretrainedConfig) -> None:
    """Vision layers whose hidden states the projector reads (LLaVA's ``vision_feature_layer``,
    VipLLaVA's five ``vision_feature_layers``) point into the twin's shorter tower: the
    nearest layer from the same end, as many layers as before."""
    vision = vars(config).get("vision_config")
    depth = _depth(vision)
    if depth is None:
        return
    for key in ("vision_feature_layer", "vision_feature_layers"):
        value = vars(config).get(key)
        if _is_count(value):
            setattr(config, key, _within(value, depth))
        elif isinstance(value, (list, tuple)) and all(_is_count(i) for i in value):
            setattr(config, key, type(value)(_within(i, depth) for i in value))


def _keep_deepstack(config: PretrainedConfig, full: PretrainedConfig) -> None:
    """Vision layers whose states go straight into the language model (Qwen3-VL's
    ``deepstack_visual_indexes``, added after its first decoder layers) become the twin's last
    ones, as many as before, its tower deepened to hold them, and its language model keeps a
    layer with none and a last one after them (as ``full`` has): a twin without them would run
    none of the code that carries them, and its graph would not be the full model's."""
    vision = vars(config).get("vision_config")
    depth = _depth(vision)
    deepstack = vars(vision).get("deepstack_visual_indexes") if depth is not None else None
    if not _is_counts(deepstack):
        return
    depth = max(depth, len(deepstack))
    setattr(vision, _layer_key(vision), depth)
    vision.deepstack_visual_indexes = list(range(depth - len(deepstack), depth))
    text = _text_config(config)
    layers = _layer_key(text)
    if layers is not None and not any(k in vars(text) for k in LAYER_LIST_KEYS):
        wanted = min(vars(_text_config(full))[layers], len(deepstack) + 2)
        setattr(text, layers, max(vars(text)[layers], wanted))


def _layer_key(config: PretrainedConfig) -> str | None:
    """The field holding ``config``'s layer count."""
    return next((k for k in LAYER_KEYS if _is_count(vars(config).get(k))), None)


def _depth(vision: Any) -> int | None:
    """A vision config's layer count (``None``: no vision config, or none named)."""
    if not isinstance(vision, PretrainedConfig):
        return None
    key = _layer_key(vision)
    return None if key is None else vars(vision)[key]


def _within(index: int, depth: int) -> int:
    """``index`` into the ``depth + 1`` hidden states of a tower (embeddings first)."""
    return min(index, depth) if index >= 0 else max(index, -(depth + 1))


#: Towers whose code takes the head size to be the width over the heads, whatever ``head_dim``
#: says (Pixtral's rotary embedding).
WIDTH_OVER_HEADS = frozenset({"pixtral"})


def _derived_by_its_class(config: PretrainedConfig) -> None:
    """Counts the config class derives when it is made, derived from the twin's values: the
    twin is made again through its class, and each top-level count that comes out otherwise
    is taken (MusicFlamingo sets ``head_dim`` to its audio encoder's width). A config whose
    dict does not make a config again (layer-indexed maps, validators written for the full
    size) keeps the derivations above."""
    try:
        made = type(config).from_dict(config.to_dict())
    except Exception:  # noqa: BLE001 - the class's own verdict on a round trip; nothing derived
        return
    for key, value in vars(config).items():
        again = vars(made).get(key)
        if _is_count(value) and _is_count(again) and again != value:
            setattr(config, key, again)


def _derive_again(config: PretrainedConfig) -> None:
    """Fields a config class derives from widths when it is made, derived again from the
    twin's: Zamba2's ``mamba_headdim`` and Falcon-H1's ``mamba_d_head`` are their SSM's width
    (a set ``mamba_d_ssm``, else the expanded hidden size) over their SSM heads; the head size
    of a tower that assumes it is its width over its heads (:data:`WIDTH_OVER_HEADS`) is so again,
    also where its width followed another config's (Mistral Large 4's Pixtral tower follows a
    text width down to 32); BLT's global transformer reads patches of ``cross_attn_k`` local
    states each, so its width is the local encoder's times that again, and the local configs'
    ``hidden_size_global`` follows it. Last, whatever the config class itself derives when it
    is made (:func:`_derived_by_its_class`)."""
    attrs = vars(config)
    heads, expand, hidden = (attrs.get(k) for k in ("n_mamba_heads", "mamba_expand", "hidden_size"))
    if _is_count(attrs.get("mamba_headdim")) and all(_is_count(v) for v in (heads, expand, hidden)):
        config.mamba_headdim = expand * hidden // heads
    heads, width = attrs.get("mamba_n_heads"), attrs.get("mamba_d_ssm")
    if _is_count(attrs.get("mamba_d_head")) and _is_count(heads) and _is_count(expand):
        config.mamba_d_head = (width if _is_count(width) else expand * hidden) // heads
    for sub in [config, *_sub_configs(config)]:
        if sub.model_type in WIDTH_OVER_HEADS:
            sub.head_dim = max(1, sub.hidden_size // sub.num_attention_heads)
    _derived_by_its_class(config)
    glob, local, k = (attrs.get(key) for key in ("global_config", "encoder_config", "cross_attn_k"))
    if glob is not None and local is not None and _is_count(k):
        glob.hidden_size = local.hidden_size * k
        for sub in _sub_configs(config):
            if _is_count(vars(sub).get("hidden_size_global")):
                sub.hidden_size_global = glob.hidden_size
