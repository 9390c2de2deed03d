"""Each vision-language family on a second config beside the one the shipped sweep verifies
(``tests/test_sweep.py`` reruns that one): other tile and patch sizes, other grids and merges,
a narrower text model, and a batch of two, through ``trace_subgraphs(fix=True)`` as a user's
code calls it. A fix or a sample rule that over-fits the default config fails here.

The families are those whose image path is sized by the config (tiles, any-resolution grids,
merges, pooling, cross-attention tiles); each second config is its swept twin with the changes
below, in the spirit of the small configs transformers' own tests build.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers

from llmc_trace import trace_subgraphs
from llmc_trace.attempt.sweep_type import DEFAULT
from llmc_trace.graph.verify import replay
from llmc_trace.models.build import twin_of_class
from llmc_trace.models.defaults import default_config
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.shrink import shrink_config
from llmc_trace.models.source import resolve_model
from llmc_trace.traced.probe import sample_for
from llmc_trace.tracing.trace import concrete_arguments
from tests.multimodal import narrow_gemma3
from tests.test_sweep import SHIPPED

#: 32-pixel tiles of 8-pixel patches (the twins: 168 and 14), and a narrower text MLP.
TILES = {"vision_config.image_size": 32, "vision_config.patch_size": 8}
NARROW = {"text_config.intermediate_size": 256}
#: Any-resolution pinpoints in those tiles: wide, tall and square, none of the default's.
PINPOINTS = [[64, 32], [32, 64], [64, 64], [96, 32]]
SECOND: dict[str, dict[str, Any]] = {
    "llava": TILES,
    "vipllava": TILES,
    "video_llava": TILES,
    "paligemma": {**TILES, **NARROW},
    "mllama": TILES,
    "mistral3": {**TILES, "vision_config.image_size": 48},  # 6 x 6 patches, merged by 2
    "llava_next": {**TILES, "image_grid_pinpoints": PINPOINTS},
    "llava_next_video": {**TILES, "image_grid_pinpoints": PINPOINTS[:3]},
    "llava_onevision": {
        **TILES,
        "image_grid_pinpoints": PINPOINTS[:3],
        "vision_aspect_ratio": "anyres_max_4",
    },
    "qwen2_vl": {"vision_config.patch_size": 8, **NARROW},
    "qwen2_5_vl": {"vision_config.patch_size": 8, "vision_config.window_size": 32, **NARROW},
    "qwen3_vl": {"vision_config.patch_size": 8, **NARROW},
    "glm4v": {**TILES, **NARROW},
    "idefics2": {"vision_config.image_size": 64, "vision_config.patch_size": 8},
    "idefics3": {"vision_config.image_size": 64, "vision_config.patch_size": 8, "scale_factor": 2},
    "smolvlm": {"vision_config.image_size": 64, "vision_config.patch_size": 8, "scale_factor": 2},
    "gemma3": {
        "vision_config.image_size": 64,
        "vision_config.patch_size": 8,
        "mm_tokens_per_image": 4,  # 8 x 8 patches pooled to 2 x 2 (the twin: 12 x 12 to 4 x 4)
    },
    "internvl": {"vision_config.image_size": [64, 64], "vision_config.patch_size": [8, 8]},
    "lfm2_vl": {"vision_config.patch_size": 8},
    "got_ocr2": {"vision_config.image_size": 64, "vision_config.patch_size": 8},
    "cohere2_vision": {"vision_config.image_size": 64, "vision_config.patch_size": 8, **NARROW},
}
#: Further changes no single field says.
ADJUST = {"gemma3": narrow_gemma3}


def swept(model_type: str) -> tuple[str, str, list[str]]:
    """The config, class and media the shipped sweep verified ``model_type`` with."""
    rows = [
        row
        for row in SHIPPED["rows"]
        if row["model_type"] == model_type
        and row["outcome"] == "verified"
        and row["modality"] in ("image", "video")
    ]
    assert rows, f"the shipped sweep verified no media of {model_type}"
    return rows[0]["config"], rows[0]["model_class"], [row["modality"] for row in rows]


def second_config(model_type: str, name: str) -> transformers.PretrainedConfig:
    config = default_config(model_type) if name == DEFAULT else resolve_model(name).config()
    config = shrink_config(copy.deepcopy(config), 2)
    for key, value in SECOND[model_type].items():
        *path, field = key.split(".")
        owner = config
        for step in path:
            owner = getattr(owner, step)
        setattr(owner, field, value)
    if model_type in ADJUST:
        ADJUST[model_type](config)
    return config


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("model_type", SECOND)
def test_a_second_config_traces_and_replays_as_the_model(model_type: str) -> None:
    name, class_name, media = swept(model_type)
    model = twin_of_class(getattr(transformers, class_name), second_config(model_type, name))
    for modality in media:
        batch = sample_for(model, modality, SampleOptions(seq_len=16, batch_size=2, seed=1))
        subgraphs = trace_subgraphs(model, batch, fix=True)
        with torch.no_grad():
            expected = model(**batch, **concrete_arguments(model, {})).logits
            actual = replay(model, subgraphs, batch).logits
        torch.testing.assert_close(actual, expected, msg=lambda m, media=modality: f"{media}: {m}")
