"""Media made by the model type's own image processor or feature extractor: the probe's first
layout, since it is the one a user's batch will have.

transformers ships a processor for most vision-language and speech types, and its output is
the model's contract in practice (LLaVA-NeXT's padded tiles with their image sizes, Dots3's
audio chunk lengths), where :mod:`llmc_trace.traced.layouts` guesses from the config. The
processor is built with its own defaults, its sizes set to the config's tower (patch, merge and
temporal patch sizes, the image side, any-resolution pinpoints), and run on a drawn picture of
a wide aspect or a tone. Only processors that need Pillow and numpy are used (a processor's
``torchvision`` backend, or a feature extractor needing ``torchaudio`` or ``librosa``, is
skipped), and a processor that cannot take the twin's sizes gives no layout: the probe's own
layouts follow either way, and the model's feature method still decides which it takes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import transformers
from transformers import PretrainedConfig
from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.shrink import TWIN_PATCHES_PER_SIDE, shrink_config
from llmc_trace.traced.layouts import Layout, first_config_with, first_int

#: A processor's pixel budget (Qwen2-VL's ``min_pixels``/``max_pixels`` as size edges) is an
#: area, not a side, where its longest edge is larger than any image side.
AREA_EDGE = 100_000
#: The tone's length: long enough for every extractor's window, short enough for a twin.
TONE_S = 1.2
#: Values a processor may make of each value it is given: a base view and tiles (LLaVA-NeXT's
#: three views of a wide picture are twice its pixels). A processor that makes more works to a
#: full-size model's patch budget (Kosmos-2.5's 4096 patches), a sample too slow for a twin.
GROWTH = 4


def processed_layouts(
    config: PretrainedConfig, modality: str, accepted: set[str], options: SampleOptions
) -> Iterator[Layout]:
    """What the type's own processor makes of a picture (``image``) or a tone (``audio``), the
    inputs the model does not name left out; nothing where no usable processor exists.

    A full-size config gets the processor's layout only where its tiny twin's config does too
    (Aria's processor takes its published 490 or 980 pixels only): the full model and its twin
    are traced on samples of one layout, or their graphs could not be compared."""
    twin = shrink_config(config)
    if twin.to_dict() != config.to_dict() and _processed(twin, modality, accepted, options) is None:
        return
    found = _processed(config, modality, accepted, options)
    if found is not None:
        yield found


def _processed(
    config: PretrainedConfig, modality: str, accepted: set[str], options: SampleOptions
) -> Layout | None:
    try:
        if modality == "image":
            name, given, media = _processed_picture(config, options)
        elif modality == "audio":
            name, given, media = _processed_tone(config, options)
        else:  # video processors need torchvision
            return None
    except Exception:  # noqa: BLE001 - no processor, a missing library, or sizes it refuses
        return None
    taken = {k: v for k, v in media.items() if k in accepted and isinstance(v, torch.Tensor)}
    if not taken or sum(v.numel() for v in taken.values()) > GROWTH * given:
        return None
    return f"what {name} makes of a {'picture' if modality == 'image' else 'tone'}", taken


def _processed_picture(
    config: PretrainedConfig, options: SampleOptions
) -> tuple[str, int, dict[str, Any]]:
    """The processor's name, the values it was given, and what it made of them."""
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(config.model_type)
    name = names.get("pil") if isinstance(names, dict) else None
    if not name:
        raise LookupError(f"{config.model_type} has no Pillow image processor")
    cls = getattr(transformers, name)
    vision = _vision(config)
    patch = first_int(vision.get("patch_size"))
    side = (
        options.image_size
        or first_int(vision.get("image_size"))
        or (patch or 14) * TWIN_PATCHES_PER_SIDE
    )
    processor = cls(**_image_sizes(cls(), config, vision, side, patch))
    generator = np.random.default_rng(options.seed)
    pictures = [
        generator.integers(0, 256, (side, side * 3 // 2, 3), dtype=np.uint8)  # wider than tall
        for _ in range(options.batch_size)
    ]
    given = sum(picture.size for picture in pictures)
    return name, given, dict(processor(images=pictures, return_tensors="pt"))


def _image_sizes(
    default: Any, config: PretrainedConfig, vision: dict[str, Any], side: int, patch: int | None
) -> dict[str, Any]:
    """The processor's size settings for the config's tower, for each it has."""
    merge = first_int(vision.get("spatial_merge_size")) or 1
    sizes: dict[str, Any] = {}
    size = getattr(default, "size", None)
    edges = {k: getattr(size, k, None) for k in ("height", "shortest_edge", "longest_edge")}
    if edges["height"] is not None:
        sizes["size"] = {"height": side, "width": side}
    elif edges["longest_edge"] is not None and edges["longest_edge"] > AREA_EDGE:
        unit = (patch or 14) * merge
        sizes["size"] = {"shortest_edge": (2 * unit) ** 2, "longest_edge": (4 * unit) ** 2}
    elif edges["shortest_edge"] is not None or edges["longest_edge"] is not None:
        sizes["size"] = {k: side for k, v in edges.items() if v is not None and k != "height"}
    if getattr(default, "crop_size", None) is not None:
        sizes["crop_size"] = {"height": side, "width": side}
    current = getattr(default, "patch_size", None)
    if patch and current is not None:
        sizes["patch_size"] = (
            {"height": patch, "width": patch} if isinstance(current, dict) else patch
        )
    if getattr(default, "merge_size", None) is not None and "spatial_merge_size" in vision:
        sizes["merge_size"] = merge
    temporal = first_int(vision.get("temporal_patch_size"))
    if getattr(default, "temporal_patch_size", None) is not None and temporal:
        sizes["temporal_patch_size"] = temporal
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if getattr(default, "image_grid_pinpoints", None) is not None and pinpoints:
        sizes["image_grid_pinpoints"] = pinpoints
    return sizes


def _processed_tone(
    config: PretrainedConfig, options: SampleOptions
) -> tuple[str, int, dict[str, Any]]:
    """The extractor's name, the samples it was given, and what it made of them."""
    name = FEATURE_EXTRACTOR_MAPPING_NAMES.get(config.model_type)
    if not name:
        raise LookupError(f"{config.model_type} has no feature extractor")
    cls = getattr(transformers, name)
    default = cls()
    settings: dict[str, Any] = {}
    bins = first_int(_audio(config).get("num_mel_bins"))
    if bins and getattr(default, "feature_size", None) not in (None, 1):
        settings["feature_size"] = bins
    extractor = cls(**settings) if settings else default
    rate = int(getattr(extractor, "sampling_rate", 16000))
    time = np.arange(int(TONE_S * rate)) / rate
    tones = [
        (0.3 * np.sin(2 * math.pi * 220.0 * (row + 1) * time)).astype(np.float32)
        for row in range(options.batch_size)
    ]
    given = sum(tone.size for tone in tones)
    return name, given, dict(extractor(tones, sampling_rate=rate, return_tensors="pt"))


def _vision(config: PretrainedConfig) -> dict[str, Any]:
    """The fields of the (sub-)config that describes the vision tower."""
    found = first_config_with(config, "patch_size")
    return vars(found) if found is not None else {}


def _audio(config: PretrainedConfig) -> dict[str, Any]:
    found = first_config_with(config, "num_mel_bins")
    return vars(found) if found is not None else {}
