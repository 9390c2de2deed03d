"""Save a tiny twin of a vision-language or audio model with processor files made here.

A twin built from a config (`models.build.build_twin`) has random weights and no processor:
no tokenizer, no image processor, no chat template. Calibrating it on images needs all three,
offline. `save_twin` writes the twin's weights with a processor that behaves as the published
one does on the points that matter to calibration: its special tokens sit at the twin config's
image/video/audio/bos/eos/pad ids (so the model finds its placeholders), the image processor is
the model's own class with image sizes shrunk as the twin's vision tower is, and the chat
template inserts the same markers the published template does. The vocabulary is a word-level
one over the words of drawn captions (`data.drawn`) and chat roles, padded with filler words to
the twin's vocabulary size, so every id the tokenizer gives is an id the twin embeds.

Example::

    >>> import tempfile
    >>> from transformers import AutoTokenizer
    >>> folder = save_twin("Qwen/Qwen2-VL-2B-Instruct", tempfile.mkdtemp())
    >>> AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|image_pad|>")
    1023
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from llmc_trace.data.drawn import CAPTION_WORDS
from llmc_trace.errors import BadInputError

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]

#: Words of chat layouts, beside the caption words: roles and the prompts rows may carry.
CHAT_WORDS = (
    "user assistant system model User Assistant USER ASSISTANT describe what does this image picture show "
    "listen audio say sound video : . , ? ! ' \" ( ) - 0 1 2 3 4 5 6 7 8 9"
).split()


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


def save_twin(
    name: str,
    folder: str | Path,
    seed: int = 0,
    *,
    adjust: Callable[[PretrainedConfig], None] | None = None,
) -> Path:
    """Write the tiny twin of built-in `name` (weights, config, processor files) to `folder`.

    `adjust` may change the twin's config before the model is built (a test that needs a
    still smaller text stack). Returns the folder. Raises `BadInputError` for an architecture
    without a twin processor (`TWIN_PROCESSORS` lists those that have one).
    """
    import torch

    from llmc_trace.models.build import model_class, prepare_config
    from llmc_trace.models.shrink import shrink_config
    from llmc_trace.models.source import resolve_model

    folder = Path(folder)
    config = shrink_config(resolve_model(name).config())
    if adjust is not None:
        adjust(config)
    plan = processor_plan(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config, name)._from_config(
            prepare_config(config), attn_implementation="eager"
        )
    model.save_pretrained(folder)
    write_processor(model.config, plan, folder)
    return folder


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


def write_processor(config: PretrainedConfig, plan: ProcessorPlan, folder: Path) -> None:
    """Write tokenizer, chat template, preprocessor and processor configs of `plan` to `folder`."""
    tokenizer = _tokenizer(config, plan)
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(_chat_template(plan))
    preprocessor = {**plan.preprocessor, "processor_class": plan.processor_class}
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    processor = {**plan.processor, "processor_class": plan.processor_class}
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def _tokenizer(config: PretrainedConfig, plan: ProcessorPlan) -> Any:
    """A word-level tokenizer of exactly the twin's vocabulary size, specials at config ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_size = config.get_text_config().vocab_size
    vocab: dict[str, int] = {}
    for key, token in plan.config_tokens.items():
        token_id = _config_id(config, key)
        if token in vocab and vocab[token] != token_id:
            raise AssertionError(f"{token} is at two ids in {config.model_type}'s twin plan")
        vocab[token] = token_id
    specials = list(dict.fromkeys([*plan.config_tokens.values(), *plan.named_tokens.values()]))
    specials += [token for token in plan.extra_tokens if token not in specials]
    words = list(dict.fromkeys([*CAPTION_WORDS, *CHAT_WORDS]))
    free = (i for i in range(vocab_size) if i not in vocab.values())
    for token in [*specials, *words]:
        if token not in vocab:
            vocab[token] = next(free)
    for token_id in free:  # fillers, so that len(tokenizer) == vocab_size
        vocab[f"<unused_{token_id}>"] = token_id
    model = Tokenizer(models.WordLevel(vocab, unk_token=plan.named_tokens["unk_token"]))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.add_special_tokens(specials)
    standard = {k: v for k, v in plan.named_tokens.items() if k in _STANDARD_NAMES}
    named_extra = {k: v for k, v in plan.named_tokens.items() if k not in _STANDARD_NAMES}
    return PreTrainedTokenizerFast(
        tokenizer_object=model,
        **standard,
        extra_special_tokens=named_extra or None,
        padding_side="right",
    )


_STANDARD_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _config_id(config: PretrainedConfig, key: str) -> int:
    for sub in (config.get_text_config(), config):
        value = getattr(sub, key, None)
        if isinstance(value, list):
            value = value[0]
        if isinstance(value, int):
            return value
    raise AssertionError(f"{config.model_type}'s twin config has no {key}")


def _chat_template(plan: ProcessorPlan) -> str:
    """A Jinja chat template: each turn opened and closed as `plan.turn` says, media parts as
    their markers, a generation prompt when asked."""
    opening, closing = plan.turn
    roles = json.dumps(plan.roles)
    media = "".join(
        f"{{% elif part['type'] == '{kind}' %}}{marker}"
        for kind, marker in plan.media_markers.items()
    )
    return (
        f"{{% set roles = {roles} %}}"
        "{% for message in messages %}"
        f"{opening}{{{{ roles.get(message['role'], message['role']) }}}}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'text' %}{{ part['text'] }}"
        f"{media}"
        "{% endif %}{% endfor %}{% endif %}"
        f"{closing}\n"
        "{% endfor %}"
        f"{{% if add_generation_prompt %}}{opening}{{{{ roles.get('assistant', 'assistant') }}}}\n"
        "{% endif %}"
    )


# ------------------------------------------------------------------ one plan per architecture
def _qwen2_vl(config: PretrainedConfig) -> ProcessorPlan:
    vision = config.vision_config
    factor = vision.patch_size * vision.spatial_merge_size
    return ProcessorPlan(
        processor_class="Qwen2_5_VLProcessor"
        if config.model_type == "qwen2_5_vl"
        else "Qwen2VLProcessor",
        preprocessor={
            "image_processor_type": "Qwen2VLImageProcessor",
            # 4 to 64 merged tokens per image: drawn images of 64-200 pixels stay small
            "min_pixels": 4 * factor * factor,
            "max_pixels": 64 * factor * factor,
            "patch_size": vision.patch_size,
            "temporal_patch_size": vision.temporal_patch_size,
            "merge_size": vision.spatial_merge_size,
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
        config_tokens={
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
            "vision_token_id": "<|vision_pad|>",
            "bos_token_id": "<|endoftext|>",
            "eos_token_id": "<|im_end|>",
        },
        named_tokens={
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<|unk|>",
        },
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
    return ProcessorPlan(
        processor_class="Qwen2AudioProcessor",
        preprocessor={
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": audio.num_mel_bins,
            "sampling_rate": 16000,
            "hop_length": 160,
            "chunk_length": 30,  # 3000 frames: the encoder's 2 x max_source_positions
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


#: Twin processors by `model_type`.
TWIN_PROCESSORS: dict[str, Callable[[PretrainedConfig], ProcessorPlan]] = {
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_vl,
    "llava": _llava,
    "idefics3": _idefics3,
    "gemma3": _gemma3,
    "qwen2_audio": _qwen2_audio,
}
