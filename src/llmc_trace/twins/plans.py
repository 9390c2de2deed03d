"""What each architecture's twin processor is made of: classes, sizes, tokens, markers.

One plan per architecture (`TWIN_PROCESSORS`), written from its published processor: the same
processor and image processor classes (or feature extractor), image sizes shrunk as
`models.shrink` shrinks the vision tower, the token each config id stands for, and the
markers its chat template puts for an image or a clip. `data.twins` writes the files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig

from llmc_trace.errors import BadInputError

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]

#: The Qwen2 tokenizer's own tokens, shared by the Qwen-VL generations and InternVL's Qwen2 text
#: stack: what the config's bos/eos ids stand for, and the tokenizer's named tokens.
QWEN_CONFIG_TOKENS = {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>"}
QWEN_NAMED_TOKENS = {
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": "<|unk|>",
}


@dataclass(frozen=True)
class ProcessorPlan:
    """What one architecture's twin processor is made of.

    `config_tokens` maps a config field (`image_token_id`) to the token placed at its id;
    `named_tokens` are the tokenizer's bos/eos/pad/unk and named extra tokens (Gemma 3's
    `boi_token`); `extra_tokens` are further special tokens at free ids. `preprocessor` is the
    `preprocessor_config.json` (image processor or feature extractor), `processor` the
    `processor_config.json` (the processor's own arguments).
    """

    processor_class: str
    preprocessor: dict[str, Any]
    config_tokens: dict[str, str]
    named_tokens: dict[str, str]
    media_markers: dict[str, str]
    turn: tuple[str, str] = ("<|im_start|>", "<|im_end|>")
    roles: dict[str, str] = field(default_factory=dict)
    extra_tokens: tuple[str, ...] = ()
    processor: dict[str, Any] = field(default_factory=dict)


def processor_plan(config: PretrainedConfig) -> ProcessorPlan:
    """The twin processor of `config`'s architecture."""
    make = TWIN_PROCESSORS.get(config.model_type)
    if make is None:
        raise BadInputError(
            f"no twin processor is made here for {config.model_type} models.",
            hint="Twin processors exist for " + ", ".join(sorted(TWIN_PROCESSORS)) + ".",
            param="model",
        )
    return make(config)


def text_plan(config: PretrainedConfig) -> ProcessorPlan:
    """A text model's twin tokenizer: its bos, eos and pad tokens at the config's ids (one
    token where two ids agree), no media markers, no processor files."""
    text = config.get_text_config()
    names = {"bos_token_id": "<s>", "eos_token_id": "</s>", "pad_token_id": "<pad>"}
    config_tokens: dict[str, str] = {}
    by_id: dict[int, str] = {}
    for key, token in names.items():
        value = getattr(text, key, None)
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and 0 <= value < text.vocab_size:
            config_tokens[key] = by_id.setdefault(value, token)
    named = {"unk_token": "<unk>"} | {
        key.removesuffix("_id"): token for key, token in config_tokens.items()
    }
    return ProcessorPlan("", {}, config_tokens, named, {})


#: Qwen-VL generations by `model_type`: processor class, image normalisation, and whether the
#: config names a `vision_token_id` (Qwen3-VL's does not).
_QWEN_VL = {
    "qwen2_vl": ("Qwen2VLProcessor", CLIP_MEAN, CLIP_STD, True),
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", CLIP_MEAN, CLIP_STD, True),
    "qwen3_vl": ("Qwen3VLProcessor", HALF, HALF, False),
    "qwen3_vl_moe": ("Qwen3VLProcessor", HALF, HALF, False),
}


def _qwen2_vl(config: PretrainedConfig) -> ProcessorPlan:
    """Qwen2-VL, Qwen2.5-VL and Qwen3-VL (dense and MoE) share one image processor class and one
    chat layout; they differ in processor class, normalisation and which token ids they name."""
    processor_class, mean, std, names_vision_token = _QWEN_VL[config.model_type]
    vision = config.vision_config
    factor = vision.patch_size * vision.spatial_merge_size
    vision_token = {"vision_token_id": "<|vision_pad|>"} if names_vision_token else {}
    return ProcessorPlan(
        processor_class=processor_class,
        preprocessor={
            "image_processor_type": "Qwen2VLImageProcessor",
            # 4 to 64 merged tokens per image: drawn images of 64-200 pixels stay small
            "min_pixels": 4 * factor * factor,
            "max_pixels": 64 * factor * factor,
            "patch_size": vision.patch_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "merge_size": vision.spatial_merge_size,
            "image_mean": mean,
            "image_std": std,
        },
        config_tokens={
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
            **vision_token,
            **QWEN_CONFIG_TOKENS,
        },
        named_tokens=dict(QWEN_NAMED_TOKENS),
        extra_tokens=("<|im_start|>",),
        media_markers={
            "image": "<|vision_start|><|image_pad|><|vision_end|>",
            "video": "<|vision_start|><|video_pad|><|vision_end|>",
        },
    )


def _llava(config: PretrainedConfig) -> ProcessorPlan:
    vision = config.vision_config
    side = vision.image_size
    return ProcessorPlan(
        processor_class="LlavaProcessor",
        preprocessor={
            "image_processor_type": "CLIPImageProcessor",
            "crop_size": {"height": side, "width": side},
            "size": {"shortest_edge": side},
            "do_center_crop": True,
            "do_convert_rgb": True,
            "resample": 3,
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
        config_tokens={
            "image_token_index": "<image>",
            "pad_token_id": "<pad>",
            "bos_token_id": "<s>",
            "eos_token_id": "</s>",
        },
        named_tokens={
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
        },
        turn=("", ""),
        roles={"user": "USER:", "assistant": "ASSISTANT:"},
        media_markers={"image": "<image>\n"},
        processor={
            "patch_size": vision.patch_size,
            "vision_feature_select_strategy": config.vision_feature_select_strategy,
            "num_additional_image_tokens": 1,  # CLIP's class token
        },
    )


def _idefics3(config: PretrainedConfig) -> ProcessorPlan:
    side = config.vision_config.image_size
    rows_and_columns = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))
    return ProcessorPlan(
        processor_class="Idefics3Processor",
        preprocessor={
            "image_processor_type": "Idefics3ImageProcessor",
            "do_image_splitting": True,
            "max_image_size": {"longest_edge": side},
            "size": {"longest_edge": 2 * side},  # at most 2 x 2 tiles and the global image
            "image_mean": HALF,
            "image_std": HALF,
            "resample": 1,
        },
        config_tokens={
            "image_token_id": "<image>",
            "bos_token_id": "<|endoftext|>",
            "pad_token_id": "<pad>",
        },
        named_tokens={
            "bos_token": "<|im_start|>",
            "eos_token": "<end_of_utterance>",
            "pad_token": "<pad>",
            "unk_token": "<|unk|>",
        },
        extra_tokens=("<fake_token_around_image>", "<global-img>", *rows_and_columns),
        turn=("<|im_start|>", "<end_of_utterance>"),
        roles={"user": "User:", "assistant": "Assistant:"},
        media_markers={"image": "<image>"},
        processor={"image_seq_len": config.image_seq_len},
    )


def _gemma3(config: PretrainedConfig) -> ProcessorPlan:
    side = config.vision_config.image_size
    return ProcessorPlan(
        processor_class="Gemma3Processor",
        preprocessor={
            "image_processor_type": "Gemma3ImageProcessor",
            "size": {"height": side, "width": side},
            "image_mean": HALF,
            "image_std": HALF,
            "resample": 2,
        },
        config_tokens={
            "image_token_index": "<image_soft_token>",
            "boi_token_index": "<start_of_image>",
            "eoi_token_index": "<end_of_image>",
            "pad_token_id": "<pad>",
            "eos_token_id": "<eos>",
            "bos_token_id": "<bos>",
        },
        named_tokens={
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        extra_tokens=("<start_of_turn>", "<end_of_turn>"),
        turn=("<start_of_turn>", "<end_of_turn>"),
        roles={"assistant": "model"},
        media_markers={"image": "<start_of_image>"},
        processor={"image_seq_length": config.mm_tokens_per_image},
    )


def _qwen2_audio(config: PretrainedConfig) -> ProcessorPlan:
    audio = config.audio_config
    rate, hop = 16000, 160
    # the window the encoder takes, in seconds: its stride-2 convolution reads twice
    # max_source_positions frames of one hop each (30 s for the published 1500)
    window_s = 2 * audio.max_source_positions * hop // rate
    return ProcessorPlan(
        processor_class="Qwen2AudioProcessor",
        preprocessor={
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": audio.num_mel_bins,
            "sampling_rate": rate,
            "hop_length": hop,
            "chunk_length": window_s,
            "n_fft": 400,
            "padding_value": 0.0,
            "return_attention_mask": True,
        },
        config_tokens={
            "audio_token_index": "<|AUDIO|>",
            "bos_token_id": "<|endoftext|>",
            "eos_token_id": "<|im_end|>",
        },
        named_tokens={
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|unk|>",
        },
        extra_tokens=("<|im_start|>", "<|audio_bos|>", "<|audio_eos|>"),
        media_markers={"audio": "<|audio_bos|><|AUDIO|><|audio_eos|>"},
    )


def _mistral3(config: PretrainedConfig) -> ProcessorPlan:
    """Mistral 3's Pixtral layout: each image a grid of `[IMG]` rows ended by `[IMG_BREAK]`,
    the last by `[IMG_END]`; its longest edge bounded as the twin's vision tower is."""
    vision = config.vision_config
    return ProcessorPlan(
        processor_class="PixtralProcessor",
        preprocessor={
            "image_processor_type": "PixtralImageProcessor",
            "patch_size": {"height": vision.patch_size, "width": vision.patch_size},
            "size": {"longest_edge": vision.image_size},
            "do_convert_rgb": True,
            "resample": 3,
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
        config_tokens={
            "image_token_index": "[IMG]",
            "bos_token_id": "<s>",
            "eos_token_id": "</s>",
            "pad_token_id": "<pad>",
        },
        named_tokens={
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        },
        extra_tokens=(
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[IMG_BREAK]",
            "[IMG_END]",
        ),
        turn=("[INST]", "[/INST]"),
        media_markers={"image": "[IMG]"},
        processor={
            "patch_size": vision.patch_size,
            "spatial_merge_size": config.spatial_merge_size,
            "image_token": "[IMG]",
            "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]",
        },
    )


def _internvl(config: PretrainedConfig) -> ProcessorPlan:
    """InternVL's layout: each image tile `<img>`, `image_seq_length` `<IMG_CONTEXT>`s, `</img>`,
    the tokens named in the tokenizer (`context_image_token`, ...) as the published -hf
    checkpoints name them. One tile per image (`max_patches` 1), so a drawn image is one
    `image_seq_length` run."""
    vision = config.vision_config
    side = _pair(vision.image_size)
    patch = _pair(vision.patch_size)
    per_tile = (side[0] // patch[0]) * (side[1] // patch[1])
    return ProcessorPlan(
        processor_class="InternVLProcessor",
        preprocessor={
            "image_processor_type": "GotOcr2ImageProcessor",
            "size": {"height": side[0], "width": side[1]},
            "crop_to_patches": False,
            "min_patches": 1,
            "max_patches": 1,
            "do_convert_rgb": True,
            "resample": 3,
            "image_mean": IMAGENET_MEAN,
            "image_std": IMAGENET_STD,
        },
        config_tokens={"image_token_id": "<IMG_CONTEXT>", **QWEN_CONFIG_TOKENS},
        named_tokens={
            **QWEN_NAMED_TOKENS,
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
        extra_tokens=("<|im_start|>",),
        media_markers={"image": "<IMG_CONTEXT>\n", "video": "<video>\n"},
        processor={"image_seq_length": round(per_tile * config.downsample_ratio**2)},
    )


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


#: Twin processors by `model_type`.
TWIN_PROCESSORS: dict[str, Callable[[PretrainedConfig], ProcessorPlan]] = {
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_vl,
    "qwen3_vl": _qwen2_vl,
    "qwen3_vl_moe": _qwen2_vl,
    "llava": _llava,
    "idefics3": _idefics3,
    "gemma3": _gemma3,
    "qwen2_audio": _qwen2_audio,
    "mistral3": _mistral3,
    "internvl": _internvl,
}
