"""The twins' processors, made offline: tokens at the config's ids, loadable as published ones.

The reference for each special token is the twin's own `config.json` (the ids the model looks
for), not the plan that wrote the tokenizer.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from transformers import AutoProcessor, AutoTokenizer

from llmc_trace.data import load_processor
from llmc_trace.twins.plans import processor_plan
from llmc_trace.errors import BadInputError, DataError
from llmc_trace.models.source import resolve_model
from tests.multimodal import TWINS

#: The token text at each config id, as the published tokenizers spell them.
PUBLISHED_TOKENS = {
    "qwen2_vl": {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                 "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"},
    "llava": {"image_token_index": "<image>"},
    "idefics3": {"image_token_id": "<image>"},
    "gemma3": {"image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
               "eoi_token_index": "<end_of_image>"},
    "qwen2_audio": {"audio_token_index": "<|AUDIO|>"},
}  # fmt: skip
PUBLISHED_TOKENS["qwen2_5_vl"] = PUBLISHED_TOKENS["qwen2_vl"]


@pytest.mark.parametrize("name", list(TWINS))
def test_special_tokens_sit_at_the_config_ids(name, twins):
    folder = twins(name)
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config", config)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == text["vocab_size"]
    for key, token in PUBLISHED_TOKENS[config["model_type"]].items():
        assert tokenizer.convert_tokens_to_ids(token) == config[key], key
        assert tokenizer.added_tokens_decoder[config[key]].special
    loaded = load_processor(folder)
    assert loaded.modalities[0] == TWINS[name]
    assert "{{" in loaded.processor.chat_template  # the template made here, loaded with it
    if loaded.built_from == "AutoProcessor":
        assert type(AutoProcessor.from_pretrained(folder)) is type(loaded.processor)


def test_no_twin_processor_for_an_architecture_without_one():
    with pytest.raises(BadInputError, match="no twin processor is made here for llama"):
        processor_plan(resolve_model("meta-llama/Llama-3.1-70B").config())


def test_internvl_processor_is_built_without_its_video_part(twins):
    """transformers refuses InternVL's video processor without torchvision (a ValueError from
    `AutoVideoProcessor`): the processor is built from its other parts, its image marker at the
    config's id, and video alone is refused saying why."""
    folder = twins("OpenGVLab/InternVL3-1B-hf")
    config = json.loads((folder / "config.json").read_text())
    loaded = load_processor(folder, "image")
    image_id = loaded.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    assert image_id == config["image_token_id"] == loaded.placeholder_ids["image"]
    assert loaded.processor.image_token == "<IMG_CONTEXT>"
    if importlib.util.find_spec("torchvision") is None:
        assert loaded.built_from == "parts"
        with pytest.raises(DataError, match="video processor code that needs torchvision"):
            loaded.require("video")
