"""Every generative model type transformers ships, with the class and default config to build it.

``coverage --all`` answers "does my architecture trace?" for types no built-in config covers,
so the list comes from transformers' own auto mappings, never from a list kept here: a new
release's new types are swept the day it is installed. A type's class is taken from the head
that accepts the most modalities (an image-text-to-text class before the causal LM of the
same type), so its images are traced too.
"""

from __future__ import annotations

from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig
from transformers.models.auto import modeling_auto

#: The generative auto mappings, richest head first: a type keeps the first class found.
GENERATIVE_MAPPINGS = (
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
)

#: Config fields set where a type's default config cannot build a model at all; each says why.
OVERRIDES: dict[str, dict[str, Any]] = {
    # ReformerModelWithLMHead asserts is_decoder=True; the default config is an encoder's
    "reformer": {"is_decoder": True},
    # the default names no image token, so the model has nowhere to put the Q-Former's output
    # (the processor of every published checkpoint adds one); any text id serves
    "blip-2": {"image_token_index": 50000},
    "instructblip": {"image_token_index": 30000},
}


def generative_types() -> dict[str, str]:
    """``model_type`` -> class name of every generative model type, sorted by type."""
    found: dict[str, str] = {}
    for mapping in GENERATIVE_MAPPINGS:
        for model_type, class_name in getattr(modeling_auto, mapping, {}).items():
            found.setdefault(model_type, class_name)
    return dict(sorted(found.items()))


def default_config(model_type: str) -> PretrainedConfig:
    """The type's config class with its own defaults (and the type's :data:`OVERRIDES`)."""
    config = CONFIG_MAPPING[model_type]()
    for key, value in OVERRIDES.get(model_type, {}).items():
        setattr(config, key, value)
    return config
