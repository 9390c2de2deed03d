"""Save a tiny twin of a built-in model with processor files (or a text model's tokenizer) made here.

A twin built from a config (`models.build.build_twin`) has random weights and no processor:
no tokenizer, no image processor, no chat template. Calibrating it on images needs all three,
offline. `save_twin` writes the twin's weights with a processor that behaves as the published
one does on the points that matter to calibration: its special tokens sit at the twin config's
image/video/audio/bos/eos/pad ids (so the model finds its placeholders), the image processor is
the model's own class with image sizes shrunk as the twin's vision tower is, and the chat
template inserts the same markers the published template does. The vocabulary is a word-level
one over the words of drawn captions (`data.drawn`) and chat roles, padded with filler words to
the twin's vocabulary size, so every id the tokenizer gives is an id the twin embeds. What
each architecture's processor is made of is its plan in `data.twin_plans`.

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
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig

from llmc_trace.data.drawn import CAPTION_WORDS
from llmc_trace.twins.plans import TWIN_PROCESSORS, ProcessorPlan, processor_plan, text_plan

#: Words of chat layouts, beside the caption words: roles and the prompts rows may carry.
CHAT_WORDS = (
    "user assistant system model User Assistant USER ASSISTANT describe what does this image picture show "
    "listen audio say sound video : . , ? ! ' \" ( ) - 0 1 2 3 4 5 6 7 8 9"
).split()


def save_twin(
    name: str,
    folder: str | Path,
    seed: int = 0,
    *,
    adjust: Callable[[PretrainedConfig], None] | None = None,
) -> Path:
    """Write the tiny twin of built-in `name` (weights, config, processor files) to `folder`.

    A text model gets a tokenizer alone (its bos/eos/pad at the config's ids). `adjust` may
    change the twin's config before the model is built (a test that needs a still smaller text
    stack). Returns the folder. Raises `BadInputError` for a multimodal architecture without a
    twin processor (`TWIN_PROCESSORS` lists those that have one).
    """
    import torch

    from llmc_trace.models.build import model_class, prepare_config
    from llmc_trace.models.shrink import shrink_config
    from llmc_trace.models.source import resolve_model

    folder = Path(folder)
    config = shrink_config(resolve_model(name).config())
    if adjust is not None:
        adjust(config)
    if hasattr(config, "quantization_config"):  # how the published weights are stored (Ministral
        del config.quantization_config  # 3's FP8), not the float weights saved here
    multimodal = config.get_text_config() is not config
    # a text model's calibration needs its tokenizer only
    plan = processor_plan(config) if multimodal or config.model_type in TWIN_PROCESSORS else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config, name)._from_config(
            prepare_config(config), attn_implementation="eager"
        )
    model.save_pretrained(folder)
    if plan is None:
        _tokenizer(model.config, text_plan(model.config)).save_pretrained(folder)
    else:
        write_processor(model.config, plan, folder)
    return folder


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
