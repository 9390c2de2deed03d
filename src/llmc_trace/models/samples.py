"""Build the inputs a model's processor would produce, from the config alone.

Tracing and verification need one realistic batch per modality: the right tensors, shapes and
placeholder tokens (a Qwen2-VL image is ``pixel_values`` patches, an ``image_grid_thw`` row,
and exactly ``t·h·w / merge²`` image tokens between the vision start and end tokens). With no
processor files at hand, each builder derives them from the config; values are seeded random.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from llmc_trace.errors import BadInputError
from llmc_trace.models.build import model_class


@dataclass(frozen=True)
class SampleOptions:
    """Sizes of a sample: sequence length of the text part, image side in pixels."""

    seq_len: int = 32
    image_size: int | None = None  # None: the smallest size the architecture accepts
    batch_size: int = 1
    seed: int = 0


class UnfitConfig(BadInputError):
    """The config cannot take the medium whatever the sample: its model has no encoder for it,
    no placeholder token, or an encoder whose features are not as wide as the token embeddings
    they would replace."""


Builder = Callable[[PretrainedConfig, SampleOptions, torch.Generator], dict[str, Any]]
_BUILDERS: dict[tuple[str, str], Builder] = {}


def sample_builder(modality: str, *model_types: str) -> Callable[[Builder], Builder]:
    """Register a builder of ``modality`` samples for the given ``model_type`` values."""

    def register(fn: Builder) -> Builder:
        for model_type in model_types:
            _BUILDERS[(modality, model_type)] = fn
        return fn

    return register


#: Forward parameters that carry each medium: a model takes a modality when its forward has one.
MEDIA_INPUTS: dict[str, tuple[str, ...]] = {
    "image": (
        "pixel_values",
        "pixel_values_images",
        "image_pixel_values",
        "flattened_patches",
        "image_patches",
    ),
    "video": ("pixel_values_videos",),
    "audio": ("input_features", "input_values", "audio_input_features"),
}


def supported_modalities(
    config: PretrainedConfig, cls: type[torch.nn.Module] | None = None
) -> list[str]:
    """Modalities the architecture takes, read from the forward of ``cls`` (default: the class
    the config names): each medium it has an input for, and text when it takes token ids and
    requires no medium (InstructBLIP's Q-Former reads an image for every prompt, Whisper's
    encoder reads nothing but audio). A medium no builder here makes from the config alone is
    probed from the model (:func:`llmc_trace.traced.probe.sample_for`).

    A forward that names none of these inputs (a generate-only class) is offered text, so that
    running it says what it takes.
    """
    forward = forward_parameters(config, cls)
    media = [m for m in MEDIA_INPUTS if any(name in forward for name in MEDIA_INPUTS[m])]
    required = any(
        forward[name].default is inspect.Parameter.empty
        for medium in media
        for name in MEDIA_INPUTS[medium]
        if name in forward
    )
    takes_text = "input_ids" in forward and not required
    return (["text"] if takes_text or not media else []) + media


def forward_parameters(
    config: PretrainedConfig, cls: type[torch.nn.Module] | None = None
) -> dict[str, inspect.Parameter]:
    """The named parameters of the model's ``forward`` (none when no class is known)."""
    try:
        model = cls or model_class(config, config.model_type)
    except BadInputError:
        return {}
    return dict(inspect.signature(model.forward).parameters)


def has_builder(config: PretrainedConfig, modality: str) -> bool:
    """Whether :func:`make_sample` builds ``modality`` from the config alone."""
    return modality == "text" or (modality, config.model_type) in _BUILDERS


def make_sample(
    config: PretrainedConfig,
    modality: str,
    options: SampleOptions,
    cls: type[torch.nn.Module] | None = None,
) -> dict[str, Any]:
    """One batch for ``modality`` from the config alone; raises :class:`BadInputError` for a
    modality the model does not take, or one only its own feature methods can size
    (:func:`llmc_trace.traced.probe.sample_for` builds those)."""
    supported = supported_modalities(config, cls)
    if modality not in supported:
        raise BadInputError(
            f"{config.model_type} models do not take {modality} inputs here.",
            hint=f"Use --modality {' or '.join(supported)}.",
            param="modality",
        )
    if not has_builder(config, modality):
        raise BadInputError(
            f"No {modality} sample of {config.model_type} can be made from its config alone.",
            hint="Build the model and use llmc_trace.traced.probe.sample_for, which sizes the "
            "sample with the model's own feature method.",
            param="modality",
        )
    check_seq_len(config, options.seq_len)
    generator = torch.Generator().manual_seed(options.seed)
    builder = _BUILDERS.get((modality, config.model_type))
    if builder is None:
        return text_sample(config, options, generator)
    return builder(config, options, generator)


def check_seq_len(config: PretrainedConfig, seq_len: int) -> None:
    """Refuse a sequence longer than the model's positions: its rotary or learned positions
    past that point are untrained (calibration statistics would be garbage) and its masks grow
    with the square of the length (a trace at 100k tokens needs tens of GB)."""
    limit = getattr(text_config_of(config), "max_position_embeddings", None)
    if isinstance(limit, int) and 0 < limit < seq_len:
        raise BadInputError(
            f"{seq_len} tokens exceed the {limit} positions {config.model_type} has "
            "(max_position_embeddings).",
            hint=f"Use a sequence length of at most {limit}.",
            param="seq_len",
        )


# ---------------------------------------------------------------- text
def text_config_of(config: PretrainedConfig) -> PretrainedConfig:
    for key in ("text_config", "language_config", "llm_config"):
        value = getattr(config, key, None)
        if isinstance(value, PretrainedConfig):
            return value
    return config


def special_token_ids(config: PretrainedConfig) -> set[int]:
    ids: set[int] = set()
    for sub in [config, text_config_of(config)]:
        for key, value in vars(sub).items():
            if key.endswith(("_token_id", "_token_index", "_token_ids")):
                for token in value if isinstance(value, list) else [value]:
                    if isinstance(token, int):
                        ids.add(token)
    return ids


def vocab_size_of(config: PretrainedConfig) -> int:
    """The text vocabulary size, from the text config, the config, or any sub-config."""
    candidates = [text_config_of(config), config]
    candidates += [v for v in vars(config).values() if isinstance(v, PretrainedConfig)]
    named = [vars(candidate).get("vocab_size") for candidate in candidates]
    for value in named:
        if isinstance(value, int) and value > 0:
            return value
    # translation models with one vocabulary per side (FSMT's src_ and tgt_vocab_size): ids
    # below the smaller one are tokens of both
    sides = [v for k, v in vars(config).items() if k.endswith("_vocab_size") and type(v) is int]
    if sides and min(sides) > 0:
        return min(sides)
    empty = next((v for v in named if isinstance(v, int)), None)
    if empty is not None:
        raise BadInputError(
            f"The {config.model_type} config's vocab_size is {empty}: a vocabulary needs at "
            "least one token.",
            hint="Correct vocab_size in config.json (or restore it from the checkpoint it came "
            "from).",
            param="model",
        )
    raise BadInputError(
        f"The {config.model_type} config names no vocabulary size, so no text sample can be built.",
        hint="Pass a model whose config (or text_config) has vocab_size.",
        param="modality",
    )


def random_tokens(
    config: PretrainedConfig, shape: tuple[int, ...], generator: torch.Generator
) -> torch.Tensor:
    """Token ids below the vocabulary size that are not special tokens (those mean images)."""
    vocab = vocab_size_of(config)
    tokens = torch.randint(0, vocab, shape, generator=generator)
    special = special_token_ids(config)
    if special:
        mask = torch.isin(tokens, torch.tensor(sorted(special)))
        replacement = next(i for i in range(vocab) if i not in special)
        tokens[mask] = replacement
    return tokens


def decoder_length(options: SampleOptions, limit: int | None = None) -> int:
    """Decoder positions of an encoder-decoder sample: half the text length (at least 2), or
    the text length up to the decoder's ``limit`` for a speech recogniser's transcript."""
    if limit is None:
        return max(2, options.seq_len // 2)
    return max(2, min(options.seq_len, limit))


def decoder_tokens(
    config: PretrainedConfig,
    options: SampleOptions,
    generator: torch.Generator,
    limit: int | None = None,
) -> torch.Tensor:
    return random_tokens(config, (options.batch_size, decoder_length(options, limit)), generator)


def text_sample(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    shape = (options.batch_size, options.seq_len)
    sample: dict[str, Any] = {
        "input_ids": random_tokens(config, shape, generator),
        "attention_mask": torch.ones(shape, dtype=torch.long),
    }
    if getattr(config, "is_encoder_decoder", False):
        sample["decoder_input_ids"] = decoder_tokens(config, options, generator)
    return sample


def with_placeholders(
    config: PretrainedConfig,
    options: SampleOptions,
    generator: torch.Generator,
    middle: list[int],
) -> dict[str, torch.Tensor]:
    """Text of ``seq_len`` tokens around ``middle`` (placeholder tokens), batch of ``batch_size``."""
    before = max(1, options.seq_len // 4)
    after = max(1, options.seq_len - before)
    rows = []
    for _ in range(options.batch_size):
        head = random_tokens(config, (before,), generator).tolist()
        tail = random_tokens(config, (after,), generator).tolist()
        rows.append(head + middle + tail)
    ids = torch.tensor(rows, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def token_id(config: PretrainedConfig, *names: str) -> int:
    for sub in [config, text_config_of(config)]:
        for name in names:
            value = getattr(sub, name, None)
            if isinstance(value, int):
                return value
    raise BadInputError(
        f"The {config.model_type} config names no {names[0]}.",
        hint="Use a config saved by a recent transformers, or --modality text.",
        param="modality",
    )


def mm_token_type_ids(config: PretrainedConfig, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token modality ids as transformers processors return them (0 text, 1 image, 2 video)."""
    types = torch.zeros_like(input_ids)
    for kind, names in ((1, ("image_token_id", "image_token_index")), (2, ("video_token_id",))):
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int):
                types[input_ids == value] = kind
                break
    return types


@sample_builder("text", "dia")
def dia_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Text for the encoder; for the decoder, audio codes of every codebook channel:
    ``decoder_input_ids`` is (batch, frames, channels), below the decoder's special ids."""
    sample = text_sample(config, options, generator)
    decoder = config.decoder_config
    frames = decoder_length(options)
    high = min(
        i
        for i in (
            decoder.pad_token_id,
            decoder.eos_token_id,
            decoder.bos_token_id,
            decoder.vocab_size,
        )
        if isinstance(i, int)
    )
    sample["decoder_input_ids"] = torch.randint(
        0, high, (options.batch_size, frames, decoder.num_channels), generator=generator
    )
    return sample


@sample_builder("text", "musicgen_decoder", "musicgen_melody_decoder")
def musicgen_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """MusicGen's decoder reads audio codes, a row per codebook of each sequence:
    ``input_ids`` is (batch * num_codebooks, length), the mask (batch, length)."""
    sample = text_sample(config, options, generator)
    rows = (options.batch_size * config.num_codebooks, options.seq_len)
    sample["input_ids"] = random_tokens(config, rows, generator)
    return sample


@sample_builder("text", "xmod")
def xmod_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Text in one of the model's languages: X-MOD routes each sequence through the adapter
    of its language (``lang_ids``, an index into ``config.languages``), and its config names
    no default language to fall back on."""
    sample = text_sample(config, options, generator)
    languages = len(config.languages)
    sample["lang_ids"] = torch.randint(0, languages, (options.batch_size,), generator=generator)
    return sample


@sample_builder("text", "kyutai_speech_to_text")
def kyutai_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Kyutai's decoder reads, at each step, a text token and one audio code per codebook:
    ``input_ids`` is (batch, length, 1 + num_codebooks), each code below the codebook's size
    (the embedding offsets each column into its own range)."""
    sample = text_sample(config, options, generator)
    shape = (options.batch_size, options.seq_len, config.num_codebooks)
    codes = torch.randint(0, config.codebook_vocab_size - 1, shape, generator=generator)
    sample["input_ids"] = torch.cat([sample["input_ids"].unsqueeze(-1), codes], dim=-1)
    return sample


@sample_builder("audio", "voxtral_realtime")
def voxtral_realtime_audio(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Streamed speech: each text position gets the audio of its own time step added to its
    embedding (no placeholders), so the mel frames come to exactly one encoder row per token:
    the encoder's stride-2 convolution, then ``downsample_factor`` rows stacked into one."""
    sample = text_sample(config, options, generator)
    frames = options.seq_len * 2 * config.downsample_factor
    mel = config.audio_config.num_mel_bins
    sample["input_features"] = torch.randn(options.batch_size, mel, frames, generator=generator)
    return sample


@sample_builder("text", "speecht5")
def speecht5_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Text-to-speech: text for the encoder; for the decoder, the mel frames spoken so far
    (batch, frames, mel bins) and a speaker x-vector, as its generation loop feeds them."""
    frames = decoder_length(options)
    return {
        **text_sample(config, options, generator),
        "decoder_input_values": torch.randn(
            options.batch_size, frames, config.num_mel_bins, generator=generator
        ),
        "speaker_embeddings": torch.randn(
            options.batch_size, config.speaker_embedding_dim, generator=generator
        ),
    }


# ---------------------------------------------------------------- audio
@sample_builder("audio", "whisper")
def whisper_audio(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    frames = 2 * config.max_source_positions  # the encoder's two stride-2 convolutions halve it
    features = torch.randn(options.batch_size, config.num_mel_bins, frames, generator=generator)
    return {
        "input_features": features,
        "decoder_input_ids": decoder_tokens(
            config, options, generator, config.max_target_positions
        ),
    }


@sample_builder("audio", "speech_to_text")
def speech_to_text_audio(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """Filter-bank frames, as the feature extractor makes them: (batch, frames, features)."""
    frames = 4 * max(8, min(options.seq_len, 64))  # the subsampler's stride-2 convs shorten it
    width = config.input_feat_per_channel * config.input_channels
    return {
        "input_features": torch.randn(options.batch_size, frames, width, generator=generator),
        "attention_mask": torch.ones(options.batch_size, frames, dtype=torch.long),
        "decoder_input_ids": decoder_tokens(
            config, options, generator, config.max_target_positions
        ),
    }


@sample_builder("audio", "moonshine")
def moonshine_audio(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One second of raw 16 kHz waveform, as Moonshine's processor passes it."""
    return {
        "input_values": 0.1 * torch.randn(options.batch_size, 16000, generator=generator),
        "decoder_input_ids": decoder_tokens(
            config, options, generator, config.max_position_embeddings
        ),
    }


@sample_builder("audio", "qwen2_audio")
def qwen2_audio_audio(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """30 s of mel frames (the encoder's fixed input length) and one audio token per encoder
    output frame, already expanded in the text as the processor does."""
    audio = config.audio_config
    frames = 2 * audio.max_source_positions  # conv2 has stride 2
    tokens = ((frames - 1) // 2 + 1 - 2) // 2 + 1  # the encoder's conv, then its pooling
    middle = [token_id(config, "audio_token_id", "audio_token_index")] * tokens
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    sample["input_features"] = torch.randn(
        options.batch_size, audio.num_mel_bins, frames, generator=generator
    )
    sample["feature_attention_mask"] = torch.ones(options.batch_size, frames, dtype=torch.long)
    return sample


# ---------------------------------------------------------------- images: Qwen2-VL family
def _qwen_vision_pixels(
    config: PretrainedConfig, grid: tuple[int, int, int], batch: int, generator: torch.Generator
) -> torch.Tensor:
    vision = config.vision_config
    channels = getattr(vision, "in_channels", None) or getattr(vision, "in_chans", 3)
    patch = vision.patch_size
    temporal = vision.temporal_patch_size
    t, h, w = grid
    return torch.randn(batch * t * h * w, channels * temporal * patch * patch, generator=generator)


def _qwen_grid(
    config: PretrainedConfig, options: SampleOptions, frames: int
) -> tuple[int, int, int]:
    vision = config.vision_config
    merge = vision.spatial_merge_size
    side = options.image_size or merge * vision.patch_size * 2
    patches = max(merge, (side // vision.patch_size) // merge * merge)
    return frames, patches, patches


def _qwen_visual_sample(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator, kind: str
) -> dict[str, Any]:
    """An image (one frame) or a video (two frames): placeholders, pixels and their grid."""
    grid = _qwen_grid(config, options, frames=1 if kind == "image" else 2)
    merge = config.vision_config.spatial_merge_size
    count = grid[0] * grid[1] * grid[2] // (merge * merge)
    middle = [token_id(config, "vision_start_token_id")]
    middle += [token_id(config, f"{kind}_token_id")] * count
    middle.append(token_id(config, "vision_end_token_id"))
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    pixels = _qwen_vision_pixels(config, grid, options.batch_size, generator)
    sample["pixel_values" if kind == "image" else "pixel_values_videos"] = pixels
    sample[f"{kind}_grid_thw"] = torch.tensor([list(grid)] * options.batch_size)
    sample["mm_token_type_ids"] = mm_token_type_ids(config, sample["input_ids"])
    return sample


@sample_builder("image", "qwen2_vl", "qwen2_5_vl")
def qwen2_vl_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    return _qwen_visual_sample(config, options, generator, "image")


@sample_builder("video", "qwen2_vl", "qwen2_5_vl")
def qwen2_vl_video(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    sample = _qwen_visual_sample(config, options, generator, "video")
    if config.model_type == "qwen2_5_vl":
        temporal = config.vision_config.temporal_patch_size
        sample["second_per_grid_ts"] = torch.full((options.batch_size,), float(temporal) / 2.0)
    return sample


# ---------------------------------------------------------------- images: LLaVA family
@sample_builder("image", "llava")
def llava_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    vision = config.vision_config
    side = vision.image_size  # CLIP position embeddings fix the input size
    patches = (side // vision.patch_size) ** 2
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    count = patches + (1 if strategy == "full" else 0)
    middle = [token_id(config, "image_token_id", "image_token_index")] * count
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    sample["pixel_values"] = torch.randn(
        options.batch_size, vision.num_channels, side, side, generator=generator
    )
    return sample


# ---------------------------------------------------------------- images: InstructBLIP
@sample_builder("image", "instructblip")
def instructblip_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """An image, the instruction tokenized twice (for the Q-Former and for the language
    model), and ``num_query_tokens`` image tokens that the Q-Former's outputs replace."""
    token = token_id(config, "image_token_id", "image_token_index")
    return _qformer_sample(config, options, generator, token, frames=None)


@sample_builder("image", "instructblipvideo")
def instructblipvideo_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """InstructBLIP's batch for a clip of four frames (the model's own count), the Q-Former's
    queries once per frame, each in place of a video token."""
    token = getattr(config, "video_token_index", None)
    if not isinstance(token, int):
        raise UnfitConfig(
            "The instructblipvideo config leaves video_token_index unset: its forward has no "
            "token to put the frames' queries in place of.",
            hint="Use a config that names the token (a published checkpoint's).",
            param="modality",
        )
    return _qformer_sample(config, options, generator, token, frames=4)


def _qformer_sample(
    config: PretrainedConfig,
    options: SampleOptions,
    generator: torch.Generator,
    token: int,
    frames: int | None,
) -> dict[str, Any]:
    """An image (or ``frames`` of a clip), the instruction for the Q-Former and the language
    model, and a ``token`` for each query the Q-Former returns (per frame)."""
    vision = config.vision_config
    side = vision.image_size
    queries = [token] * config.num_query_tokens * (frames or 1)
    text = random_tokens(config, (options.batch_size, options.seq_len), generator)
    input_ids = torch.cat([torch.tensor([queries] * options.batch_size), text], dim=1)
    picture = (getattr(vision, "num_channels", 3), side, side)
    shape = (options.batch_size, *([frames] if frames else []), *picture)
    sample: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "qformer_input_ids": torch.randint(
            1, config.qformer_config.vocab_size, tuple(text.shape), generator=generator
        ),
        "qformer_attention_mask": torch.ones_like(text),
        "pixel_values": torch.randn(*shape, generator=generator),
    }
    if not config.use_decoder_only_language_model:
        sample["decoder_input_ids"] = decoder_tokens(config, options, generator)
    return sample


@sample_builder("image", "blip-2")
def blip2_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """InstructBLIP's image batch without its instruction for the Q-Former: BLIP-2's Q-Former
    reads only the image."""
    sample = instructblip_image(config, options, generator)
    del sample["qformer_input_ids"], sample["qformer_attention_mask"]
    return sample


@sample_builder("image", "blip")
def blip_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """An image and a caption: BLIP's text decoder cross-attends to the image, no placeholders."""
    sample = text_sample(config, options, generator)
    vision = config.vision_config
    side = vision.image_size  # ViT position embeddings fix the input size
    channels = getattr(vision, "num_channels", 3)
    sample["pixel_values"] = torch.randn(
        options.batch_size, channels, side, side, generator=generator
    )
    return sample


# ---------------------------------------------------------------- images: Gemma 3
@sample_builder("image", "gemma3")
def gemma3_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One image: begin-of-image, ``mm_tokens_per_image`` soft tokens, end-of-image."""
    vision = config.vision_config
    image = token_id(config, "image_token_id", "image_token_index")
    middle = [token_id(config, "boi_token_id", "boi_token_index")]
    middle += [image] * config.mm_tokens_per_image
    middle.append(token_id(config, "eoi_token_id", "eoi_token_index"))
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    sample["token_type_ids"] = (sample["input_ids"] == image).long()
    side = vision.image_size  # SigLIP position embeddings fix the input size
    sample["pixel_values"] = torch.randn(
        options.batch_size, vision.num_channels, side, side, generator=generator
    )
    return sample


# ---------------------------------------------------------------- images: Idefics3 / SmolVLM
@sample_builder("image", "idefics3", "smolvlm")
def idefics3_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One image, pixel-shuffled into ``(side/patch)² / scale_factor²`` image tokens."""
    vision = config.vision_config
    side = vision.image_size
    count = (side // vision.patch_size) ** 2 // (config.scale_factor**2)
    middle = [token_id(config, "image_token_id")] * count
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    sample["pixel_values"] = torch.randn(
        options.batch_size, 1, vision.num_channels, side, side, generator=generator
    )
    sample["pixel_attention_mask"] = torch.ones(options.batch_size, 1, side, side, dtype=torch.bool)
    return sample


# ---------------------------------------------------------------- images: Mllama (Llama 3.2 Vision)
@sample_builder("image", "mllama")
def mllama_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One single-tile image: one image token, cross-attended by the text after it."""
    vision = config.vision_config
    tiles = vision.max_num_tiles
    side = vision.image_size
    middle = [token_id(config, "image_token_id", "image_token_index")]
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    batch, seq = sample["input_ids"].shape
    sample["pixel_values"] = torch.randn(
        batch, 1, tiles, vision.num_channels, side, side, generator=generator
    )
    sample["aspect_ratio_ids"] = torch.ones(batch, 1, dtype=torch.long)  # (1, 1): one tile
    sample["aspect_ratio_mask"] = torch.zeros(batch, 1, tiles, dtype=torch.long)
    sample["aspect_ratio_mask"][:, :, 0] = 1
    cross = torch.zeros(batch, seq, 1, tiles, dtype=torch.long)
    first_image = int((sample["input_ids"][0] == middle[0]).nonzero()[0])
    cross[:, first_image:, :, 0] = 1
    sample["cross_attention_mask"] = cross
    return sample


@sample_builder("image", "inkling_mm_model")
def inkling_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """A picture as Inkling's vision tower reads it: its patches, each a (frames, side, side,
    channels) block, channels last, with one image token per patch; ``pixel_values`` holds
    the patches of the whole batch, (batch * patches, frames, side, side, channels)."""
    vision = config.vision_config
    patches = 4
    sample: dict[str, Any] = with_placeholders(
        config, options, generator, [token_id(config, "image_token_id")] * patches
    )
    block = (vision.temporal_patch_size, vision.patch_size, vision.patch_size, vision.num_channels)
    sample["pixel_values"] = torch.randn(options.batch_size * patches, *block, generator=generator)
    return sample


@sample_builder("image", "idefics")
def idefics_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One picture per prompt, read by IDEFICS's cross-attention layers, not put in place of
    tokens: ``pixel_values`` is (batch, pictures, channels, side, side) and
    ``image_attention_mask`` (batch, length, pictures) says which picture each token sees."""
    vision = config.vision_config
    sample = text_sample(config, options, generator)
    side = vision.image_size
    sample["pixel_values"] = torch.randn(
        options.batch_size, 1, vision.num_channels, side, side, generator=generator
    )
    sample["image_attention_mask"] = torch.ones(
        options.batch_size, options.seq_len, 1, dtype=torch.long
    )
    return sample


def _word_boxes(options: SampleOptions, generator: torch.Generator) -> torch.Tensor:
    """A box per token, (x0, y0, x1, y1) on the page scaled to [0, 1], the upper left corner
    first: (batch, length, 4)."""
    corners = torch.rand(options.batch_size, options.seq_len, 2, 2, generator=generator)
    low, high = corners.min(dim=2).values, corners.max(dim=2).values
    return torch.cat([low, high], dim=-1)


@sample_builder("text", "udop")
def udop_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """A document's words and where each lies on the page (``bbox``): UDOP's layout
    embeddings read the boxes even where no page image is given."""
    sample = text_sample(config, options, generator)
    sample["bbox"] = _word_boxes(options, generator)
    return sample


@sample_builder("image", "udop")
def udop_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """A document's words, their boxes and the page's image, of the size UDOP's patch
    embedding is built for (its patches join the word embeddings, boxes made by the model)."""
    sample = udop_text(config, options, generator)
    side = config.image_size
    sample["pixel_values"] = torch.randn(
        options.batch_size, config.num_channels, side, side, generator=generator
    )
    return sample


# ---------------------------------------------------------------- robot policies: PI0
@sample_builder("text", "pi0")
def pi0_text(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """An instruction and the robot's state (``max_state_dim`` values), which PI0's action
    expert reads beside the vision-language model's prefix."""
    sample = text_sample(config, options, generator)
    sample["state"] = torch.randn(options.batch_size, config.max_state_dim, generator=generator)
    return sample


@sample_builder("image", "pi0")
def pi0_image(
    config: PretrainedConfig, options: SampleOptions, generator: torch.Generator
) -> dict[str, Any]:
    """One camera's picture (PaliGemma's: one image token per patch), the mask of the cameras
    present, the instruction and the robot's state."""
    vlm = config.vlm_config
    vision = vlm.vision_config
    side = vision.image_size  # SigLIP position embeddings fix the input size
    middle = [vlm.image_token_id] * (side // vision.patch_size) ** 2
    sample: dict[str, Any] = with_placeholders(config, options, generator, middle)
    sample["pixel_values"] = torch.randn(
        options.batch_size, 1, vision.num_channels, side, side, generator=generator
    )
    sample["pixel_attention_mask"] = torch.ones(options.batch_size, 1, dtype=torch.bool)
    sample["state"] = torch.randn(options.batch_size, config.max_state_dim, generator=generator)
    return sample
