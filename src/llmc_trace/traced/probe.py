"""A sample of any modality for a built model: the config's builder where one is registered,
else one sized by the model's own feature method.

The builders of :mod:`llmc_trace.models.samples` derive every input from the config, one
architecture at a time; transformers ships a hundred vision-language and speech models, and
most have none. Those models keep one contract, which this module relies on: their
``get_image_features`` (``get_video_features``, ``get_audio_features``) turns the media inputs
into the rows that replace the placeholder tokens, and the forward refuses a text whose
placeholders are not exactly as many. So the probe lays the media out in each way such models
take them (:mod:`llmc_trace.traced.layouts`), keeps the first layout the model's own method
accepts, and writes one placeholder per row that came out, or as many as the forward then
hands its own placeholder check, where a release's forward adds rows after the method. A
model without such a method gets no placeholders, and the first layout its encoder takes where
it has no prompt (Whisper, a vision encoder-decoder), else the first that fits its inputs (GIT
prepends the picture). On a
model on ``meta`` (a full-size trace) the method runs mixed: shapes only, with a grid or mask
read for real, so probing a 70B config costs nothing; sizes that pass through a copy to
``meta`` keep their values there (Mistral 3's ``image_sizes``, LFM2-VL's token slots).
"""

from __future__ import annotations

import contextlib
import inspect
from itertools import chain
from collections.abc import Callable
from typing import Any

import torch
from transformers import PretrainedConfig

from llmc_trace.core.sizes import parameter_dtype
from llmc_trace.errors import BadInputError
from llmc_trace.models.samples import (
    SampleOptions,
    UnfitConfig,
    decoder_tokens,
    forward_parameters,
    has_builder,
    make_sample,
    supported_modalities,
    text_sample,
    with_placeholders,
)
from llmc_trace.traced.layouts import layouts
from llmc_trace.traced.processed import processed_layouts
from llmc_trace.tracing.values import MixedExecution, module_has_meta_state

#: Types that count a video's frames by the image token, between the video's start and end
#: tokens (GLM-4V and its heirs: their ``get_placeholder_mask`` says so).
FRAMES_AS_IMAGES = frozenset({"glm4v", "glm46v", "glm4v_moe", "glm5_next", "glm_ocr", "glmga"})
#: Where a model without an image token is told which positions its image embeddings take.
POSITION_MASK = "image_embeds_position_mask"
#: The ids processors give each medium's placeholders in ``mm_token_type_ids`` (0: text).
MM_TOKEN_TYPES = {"image": 1, "video": 2}
#: Sub-configs that describe each medium's encoder: a config that sets one to ``None`` builds
#: no encoder for it.
ENCODER_CONFIGS = {"image": "vision_config", "video": "vision_config", "audio": "audio_config"}
#: The config fields naming a medium's placeholder token, and those around it, first found wins.
TOKENS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "image": (
        ("image_token_id", "image_token_index"),
        ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index"),
        ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index"),
    ),
    "video": (
        ("video_token_id", "video_token_index"),
        ("vision_start_token_id", "video_start_token_id"),
        ("vision_end_token_id", "video_end_token_id"),
    ),
    "audio": (
        ("audio_token_id", "audio_token_index"),
        ("audio_start_token_id", "audio_bos_token_id", "boa_token_id"),
        ("audio_end_token_id", "audio_eos_token_id", "eoa_token_id"),
    ),
}


def sample_for(model: torch.nn.Module, modality: str, options: SampleOptions) -> dict[str, Any]:
    """One batch of ``modality`` for ``model`` (a twin, real weights, or a model on ``meta``).

    Raises :class:`~llmc_trace.errors.BadInputError` when the model does not take the modality,
    or when no layout of it runs through the model's feature method (the error names the
    layouts tried and the model's answer to each); :class:`UnfitConfig` when the config itself
    cannot take it.

    Media come in the model's own dtype, as a user's code casts a processor's float32 output:
    a full-size bfloat16 model and its float32 twin then take the same branches on dtypes
    (Granite Speech casts features that are not in its dtype), and their graphs compare.
    """
    floats = parameter_dtype(model)
    sample = _sample_for(model, modality, options)
    return {
        key: value.to(floats)
        if floats is not None and isinstance(value, torch.Tensor) and value.is_floating_point()
        else value
        for key, value in sample.items()
    }


def _sample_for(model: torch.nn.Module, modality: str, options: SampleOptions) -> dict[str, Any]:
    config = model.config
    cls = type(model)
    if has_builder(config, modality) or modality not in supported_modalities(config, cls):
        return make_sample(config, modality, options, cls)
    _check_encoder(model, modality)
    generator = torch.Generator().manual_seed(options.seed)
    forward = forward_parameters(config, cls)
    features = _feature_method(model, modality)
    if features is not None and "input_ids" in forward:
        _check_token(model, modality)
    method = features or _encoder_forward(model, forward)
    accepted = set(forward) | set(_named_parameters(method) if method else [])
    tried = []
    processed = processed_layouts(config, modality, accepted, options)
    for name, media in chain(processed, layouts(config, modality, accepted, options, generator)):
        if method is None:
            return _assemble(config, forward, modality, media, 0, options, generator)
        try:
            rows, width = _feature_rows(method, media)
        except Exception as err:  # noqa: BLE001 - the model's answer: this layout is not its own
            tried.append(f"{name} ({type(err).__name__}: {str(err).strip()[:160]})")
            continue
        if features is not None:
            _check_width(model, modality, width)
            # a mask the feature method does not read is one the forward applies to the rows
            # it returned (Granite Speech), of a length the layout cannot know: left out, as
            # such a forward allows
            read = set(_named_parameters(features))
            media = {k: v for k, v in media.items() if not k.endswith("mask") or k in read}
        state = generator.get_state()
        sample = _assemble(config, forward, modality, media, rows, options, generator)
        placed = _rows_placed(model, modality, sample) if features is not None else None
        if placed is None or placed == rows:
            return sample
        generator.set_state(state)  # the same text around the placeholders the forward wants
        return _assemble(config, forward, modality, media, placed, options, generator)
    raise BadInputError(
        f"No {modality} sample of {config.model_type} could be built: "
        + (
            f"its {method.__name__} took none of the layouts tried: {'; '.join(tried)}"
            if tried
            else f"its forward takes none of the {modality} layouts known here"
        )
        + ".",
        hint=f"Trace another modality, or add a {modality} builder for {config.model_type} "
        "to llmc_trace.models.samples.",
        param="modality",
    )


def _check_encoder(model: torch.nn.Module, modality: str) -> None:
    """Refuse a medium the model was built without an encoder for (Gemma 4's default config
    has no vision tower; its forward takes pixel values all the same)."""
    key = ENCODER_CONFIGS[modality]
    try:
        encoder = model.get_encoder(modality)  # transformers' lookup of the medium's tower
    except (AttributeError, TypeError, ValueError):  # no such lookup: the config may tell
        encoder = model
    if encoder is None or (hasattr(model.config, key) and getattr(model.config, key) is None):
        raise UnfitConfig(
            f"{type(model).__name__} built from this config has no {modality} encoder.",
            hint="Use a config that names one (a published checkpoint's).",
            param="modality",
        )


def _check_token(model: torch.nn.Module, modality: str) -> None:
    """Refuse a medium whose placeholder token the config leaves unset (Voxtral's default
    ``audio_token_id`` is ``None``): the forward finds no place for the features."""
    names = [n for n in TOKENS[modality][0] if hasattr(model.config, n)]
    if names and _token(model.config, tuple(names)) is None:
        raise UnfitConfig(
            f"The {model.config.model_type} config leaves {names[0]} unset: its forward has "
            f"no token to put the {modality} features in place of.",
            hint="Use a config that names the token (a published checkpoint's).",
            param="modality",
        )


def _check_width(model: torch.nn.Module, modality: str, width: int) -> None:
    """Refuse features that cannot replace token embeddings: the forward checks their count
    in embedding widths, so no count of placeholders fits them."""
    embeddings = model.get_input_embeddings()
    wide = getattr(embeddings, "embedding_dim", None)
    if isinstance(wide, int) and width not in (0, wide):
        raise UnfitConfig(
            f"{type(model).__name__}'s own {modality} features are {width} wide and its token "
            f"embeddings {wide}: its config does not fit them together.",
            hint="Use a config whose encoder's output width is the text model's hidden size.",
            param="modality",
        )


def _feature_method(model: torch.nn.Module, modality: str) -> Callable[..., Any] | None:
    """``get_<medium>_features`` with its own parameters: the inner model's where the outer
    one only passes ``*args, **kwargs`` on to it."""
    name = f"get_{modality}_features"
    found = [
        getattr(owner, name)
        for owner in (getattr(model, "model", None), model)
        if owner is not None and callable(getattr(owner, name, None))
    ]
    named = [method for method in found if _named_parameters(method)]
    return (named or found or [None])[0]


def _encoder_forward(
    model: torch.nn.Module, forward: dict[str, inspect.Parameter]
) -> Callable[..., Any] | None:
    """The encoder's forward of an encoder-decoder that takes no prompt (Whisper, a vision
    encoder-decoder): the media go to the encoder alone, so the encoder says which layout
    is its own."""
    get_encoder = getattr(model, "get_encoder", None)
    if "input_ids" in forward or not callable(get_encoder):
        return None
    encoder = get_encoder()
    return encoder.forward if isinstance(encoder, torch.nn.Module) else None


def _parameters(method: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters ``method`` can be given by name."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in inspect.signature(method).parameters.values() if p.kind in kinds]


def _named_parameters(method: Callable[..., Any]) -> list[str]:
    return [p.name for p in _parameters(method)]


def _feature_rows(method: Callable[..., Any], media: dict[str, Any]) -> tuple[int, int]:
    """Rows the feature method makes of ``media`` (each replaces one placeholder token), and
    their width."""
    parameters = _parameters(method)
    named = {p.name for p in parameters}
    owner = getattr(method, "__self__", None)
    weights = list(owner.parameters()) if isinstance(owner, torch.nn.Module) else []
    on_meta = any(p.is_meta for p in weights)
    dtype = weights[0].dtype if weights else torch.float32  # as a processor's output is cast
    arguments = {
        key: value.to(dtype) if value.is_floating_point() else value
        for key, value in media.items()
        if key in named
    }
    renamed = _renamed_pixels(parameters, media)
    if renamed is not None:
        arguments[renamed[0]] = media[renamed[1]].to(dtype)
    required = {p.name for p in parameters if p.default is inspect.Parameter.empty}
    if "input_ids" in required and "input_ids" not in arguments and owner is not None:
        placeholders = _placeholders_for(owner, media)
        if placeholders is not None:
            arguments["input_ids"] = placeholders
    with torch.no_grad(), MixedExecution() if on_meta else contextlib.nullcontext():
        output = method(**arguments)
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        pooled = getattr(output, "last_hidden_state", output)
    tensors = [pooled] if isinstance(pooled, torch.Tensor) else list(pooled)
    return sum(t.numel() // t.shape[-1] for t in tensors), int(tensors[0].shape[-1])


def _placeholders_for(model: torch.nn.Module, media: dict[str, Any]) -> torch.Tensor | None:
    """Token ids holding, per row, as many audio placeholders as the audio encoder makes of
    that row's features, for a feature method that reads the placeholders themselves
    (MusicFlamingo times each encoder row by the run of placeholders it fills). The count is
    the encoder's own ``_get_feat_extract_output_lengths`` of the features' mask (transformers'
    audio encoders define it); ``None`` where there is no such encoder, mask or token."""
    token = _token(model.config, TOKENS["audio"][0])
    masks = [v for k, v in media.items() if k.endswith("mask") and isinstance(v, torch.Tensor)]
    encoders = [
        m for m in model.modules() if callable(getattr(m, "_get_feat_extract_output_lengths", None))
    ]
    if token is None or not masks or not encoders:
        return None
    lengths = encoders[0]._get_feat_extract_output_lengths(masks[0].sum(-1).long())
    lengths = lengths[-1] if isinstance(lengths, tuple) else lengths  # (after conv, after pool)
    rows = [int(n) for n in torch.as_tensor(lengths).reshape(-1)]
    other = 0 if token != 0 else 1  # any id but the placeholder pads the shorter rows
    ids = torch.full((len(rows), max(rows)), other, dtype=torch.long)
    for row, count in enumerate(rows):
        ids[row, :count] = token
    return ids


class _Placed(Exception):
    """Raised from the placeholder check to stop a forward once its rows are counted."""


def _rows_placed(model: torch.nn.Module, modality: str, sample: dict[str, Any]) -> int | None:
    """How many rows the forward itself hands its placeholder check (``get_placeholder_mask``,
    given ``<medium>_features``) for ``sample``; ``None`` where it has no such check or does
    not reach it. The feature method's rows are the forward's in most models, but not in all
    releases: transformers 5.17's LLaVA-OneVision forward appends one newline row per video
    after ``get_video_features`` returns, which 5.24's method appends itself."""
    owners = [m for m in model.modules() if callable(getattr(m, "get_placeholder_mask", None))]
    if not owners:
        return None
    counted: list[int] = []

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def check(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
            features, embeds = bound.get(f"{modality}_features"), bound.get("inputs_embeds")
            if features is None or not isinstance(embeds, torch.Tensor):
                return original(*args, **kwargs)
            tensors = [features] if isinstance(features, torch.Tensor) else list(features)
            # as the check itself counts: the features' elements over the embeddings' width
            counted.append(sum(t.numel() for t in tensors) // embeds.shape[-1])
            raise _Placed

        return check

    # on the instances, whose attribute shadows the class's method for this one forward
    for owner in owners:
        owner.get_placeholder_mask = counting(owner.get_placeholder_mask)
    on_meta = module_has_meta_state(model)
    try:
        with torch.no_grad(), MixedExecution() if on_meta else contextlib.nullcontext():
            model(**sample)
    except _Placed:
        pass
    except Exception:  # noqa: BLE001 - a forward that cannot run here: the method's count stands
        return None
    finally:
        for owner in owners:
            del owner.get_placeholder_mask
    return counted[0] if counted else None


def _renamed_pixels(
    parameters: list[inspect.Parameter], media: dict[str, Any]
) -> tuple[str, str] | None:
    """(the method's name, the layout's key) where the feature method (its ``parameters``)
    names the medium's pixels more briefly than the forward does: its first required parameter
    absent from the layout, and one floating-point input the method does not name, whose name
    starts with it. transformers 5.17's LLaVA-OneVision and LLaVA-NeXT-Video take a video's
    frames as ``pixel_values``, which their forwards call ``pixel_values_videos``."""
    required = [p.name for p in parameters if p.default is inspect.Parameter.empty]
    if not required or required[0] in media:
        return None
    named = {p.name for p in parameters}
    unread = [
        key
        for key, value in media.items()
        if key not in named and isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    if len(unread) == 1 and unread[0].startswith(required[0]):
        return required[0], unread[0]
    return None


def _assemble(
    config: PretrainedConfig,
    forward: dict[str, inspect.Parameter],
    modality: str,
    media: dict[str, Any],
    rows: int,
    options: SampleOptions,
    generator: torch.Generator,
) -> dict[str, Any]:
    """The text around ``rows`` placeholders (per batch row), the media, and the per-token
    modality ids a processor adds where the forward takes them."""
    token_names, start_names, end_names = TOKENS[modality]
    if modality == "video" and config.model_type in FRAMES_AS_IMAGES:
        token_names = TOKENS["image"][0]
    token = _token(config, token_names)
    marked = POSITION_MASK in forward and modality == "image"
    count = rows // options.batch_size
    if "input_ids" not in forward:  # a speech or vision encoder-decoder: no prompt to place into
        sample: dict[str, Any] = {}
    elif count == 0 or (token is None and not marked):
        sample = text_sample(config, options, generator)
    else:
        # with no placeholder token (Kosmos-2), any text marked by the position mask serves
        placeholders = [token] * count if token is not None else [0] * count
        middle = [t for t in (_token(config, start_names),) if t is not None]
        start = max(1, options.seq_len // 4) + len(middle)  # where with_placeholders puts them
        middle += placeholders + [t for t in (_token(config, end_names),) if t is not None]
        sample = with_placeholders(config, options, generator, middle)
        if marked:
            sample[POSITION_MASK] = torch.zeros_like(sample["input_ids"])
            sample[POSITION_MASK][:, start : start + count] = 1
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in forward:
        limit = getattr(config, "max_target_positions", None)
        sample.setdefault("decoder_input_ids", decoder_tokens(config, options, generator, limit))
    sample.update(media)
    ids = sample.get("input_ids")
    if ids is not None and token is not None:
        placed = (ids == token).long()
        if "mm_token_type_ids" in forward:  # as processors mark them: 1 image, 2 video
            sample["mm_token_type_ids"] = placed * MM_TOKEN_TYPES.get(modality, 0)
        if "token_type_ids" in forward:
            sample["token_type_ids"] = placed
    return sample


def _token(config: PretrainedConfig, names: tuple[str, ...]) -> int | None:
    text = getattr(config, "text_config", None)
    for owner in (config, text):
        for name in names:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None
