"""The ways vision-language and speech models take their media, each built from the config.

A processor lays an image out as its model expects: one picture (LLaVA), tiles with a mask of
real pixels (Idefics), flattened patches with a grid of their positions (Qwen2-VL), patches
with their coordinates (Gemma 4, SigLIP 2's NaFlex); audio as mel frames, frames of features,
or a waveform. :func:`layouts` yields every layout whose inputs the model's forward or feature
method names, most specific first, for :mod:`llmc_trace.traced.probe` to try in turn. Sizes
come from the config (a tower with position embeddings for one image size gets that size);
values are seeded random.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.shrink import TWIN_PATCHES_PER_SIDE

Layout = tuple[str, dict[str, Any]]
#: Audio frames where the encoder does not fix the count (a Whisper encoder does): 2 s of 10 ms
#: frames, a whole number of the windows encoders cut them into (Qwen3-ASR's 100).
AUDIO_FRAMES = 200
#: Raw waveform samples: 1.2 s at 16 kHz, a whole number of codec frames (1920, 320, 160).
WAVEFORM = 19200


@dataclass(frozen=True)
class Geometry:
    """A vision tower's input geometry: channels, patch side, image side in pixels, patches
    merged per side into one token, frames per temporal patch, the views an any-resolution
    model cuts one picture into (LLaVA-NeXT's base view and tiles), and the side of a second,
    high-resolution tower's picture (DeepSeek-VL hybrid's), if any."""

    channels: int
    patch: int
    side: int
    merge: int
    temporal: int
    views: int
    high_side: int | None

    @property
    def per_side(self) -> int:
        """Patches per side of a patch-grid image: two merged tokens, unless the image size
        was asked for."""
        return max(self.merge, self.side // self.patch // self.merge * self.merge)


def layouts(
    config: PretrainedConfig,
    modality: str,
    accepted: set[str],
    options: SampleOptions,
    generator: torch.Generator,
) -> Iterator[Layout]:
    """Each layout of ``modality`` whose inputs the model takes (``accepted``: the parameter
    names of its forward and feature method)."""
    if modality == "audio":
        yield from _audio(config, accepted, options.batch_size, generator)
        return
    if modality == "image":
        yield from _flattened(config, accepted, options.batch_size, generator)
    geometry = _geometry(config, options)
    if geometry is not None:
        builders = _VIDEO if modality == "video" else _IMAGE
        for build in builders:
            built = build(geometry, accepted, options.batch_size, generator)
            yield from built


def _geometry(config: PretrainedConfig, options: SampleOptions) -> Geometry | None:
    # a vision transformer's patches, or a VQ tokenizer's cells (Apertus 1.5's: one code per
    # spatial_scale_factor pixels, of any picture of whole cells)
    vision = first_config_with(config, "patch_size") or first_config_with(
        config, "spatial_scale_factor"
    )
    if vision is None:
        return None
    fields = vars(vision)
    patch = first_int(fields.get("patch_size")) or first_int(fields.get("spatial_scale_factor"))
    merge = first_int(fields.get("spatial_merge_size")) or 1
    size = first_int(fields.get("image_size"))
    grid_side = 2 * merge * patch if "spatial_merge_size" in fields else None
    side = options.image_size or size or grid_side or patch * TWIN_PATCHES_PER_SIDE
    channels = next(
        (fields[k] for k in ("num_channels", "in_channels", "in_chans") if fields.get(k)), 3
    )
    temporal = first_int(fields.get("temporal_patch_size")) or 1
    high = vars(config).get("high_res_vision_config")
    high_side = first_int(vars(high).get("image_size")) if high is not None else None
    return Geometry(channels, patch, side, merge, temporal, _views(config, side), high_side)


def _views(config: PretrainedConfig, side: int) -> int:
    """The base view and the tiles of the best pinpoint for a square picture of ``side``, as
    transformers counts them for any-resolution models (``image_grid_pinpoints``)."""
    pinpoints = getattr(config, "image_grid_pinpoints", None)
    if not pinpoints:
        return 1
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    return int(image_size_to_num_patches((side, side), pinpoints, side))


def first_config_with(config: PretrainedConfig, key: str) -> PretrainedConfig | None:
    """The config, or the first sub-config (depth first), holding a positive ``key``."""
    if first_int(vars(config).get(key)):
        return config
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig):
            found = first_config_with(value, key)
            if found is not None:
                return found
    return None


def first_int(value: Any) -> int | None:
    """An int, or the first of a list of them (a (height, width) size)."""
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _randn(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


# ---------------------------------------------------------------- images
def _grid(g: Geometry, takes: set[str], batch: int, generator: torch.Generator) -> list[Layout]:
    """Patches and their (frames, height, width) grid (Qwen2-VL and its heirs)."""
    key = next((k for k in ("image_grid_thw", "image_grid_hw") if k in takes), None)
    if key is None:
        return []
    side = g.per_side
    grid = [1, side, side] if key.endswith("thw") else [side, side]
    grids = {key: torch.tensor([grid] * batch)}
    found = _patch_layouts(g, "pixel_values", batch * side * side, grids, takes, "image", generator)
    # Inkling 2 takes one square of merged patches per token, channels last, its grid in tokens
    tokens = side // g.merge
    merged = g.patch * g.merge
    pixels = _randn(batch * tokens * tokens, merged, merged, g.channels, generator=generator)
    in_tokens = {
        key: torch.tensor(
            [[1, tokens, tokens] if key.endswith("thw") else [tokens, tokens]] * batch
        )
    }
    found.append(
        ("merged patches, each a token, with their grid", {"pixel_values": pixels, **in_tokens})
    )
    return found


def _patch_layouts(
    g: Geometry,
    key: str,
    count: int,
    grids: dict[str, torch.Tensor],
    takes: set[str],
    modality: str,
    generator: torch.Generator,
) -> list[Layout]:
    """``count`` patches beside their grid, each flat (its frames, channels and pixels in one
    row, of ``temporal`` frames or of two where the config does not say), as pixels, or in a
    batch of one; with the merge size where the model takes it (VideoLLaMA 3)."""
    extra = dict(grids)
    merges = f"{modality}_merge_sizes"
    if merges in takes:
        extra[merges] = torch.full((len(next(iter(grids.values()))),), g.merge)
    pixels = g.channels * g.patch * g.patch
    found = [
        (
            f"flattened patches of {frames} frame(s) with their grid",
            {key: _randn(count, frames * pixels, generator=generator), **extra},
        )
        for frames in dict.fromkeys((g.temporal, 2))
    ]
    square = (g.channels, g.patch, g.patch)
    found.append(
        ("patches with their grid", {key: _randn(count, *square, generator=generator), **extra})
    )
    found.append(
        (
            "a batch of patches with their grid",
            {key: _randn(1, count, *square, generator=generator), **extra},
        )
    )
    return found


def _positioned(
    g: Geometry, takes: set[str], batch: int, generator: torch.Generator
) -> list[Layout]:
    """Patches with their coordinates: Gemma 4's ``image_position_ids``, SigLIP 2's
    ``spatial_shapes`` with a mask of real patches."""
    side = g.per_side
    flat = g.channels * g.patch * g.patch
    pixels = _randn(batch, side * side, flat, generator=generator)
    if "image_position_ids" in takes:
        rows, columns = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        positions = torch.stack([columns.flatten(), rows.flatten()], dim=-1)
        return [
            (
                "patches with their positions",
                {"pixel_values": pixels, "image_position_ids": positions.expand(batch, -1, -1)},
            )
        ]
    if "spatial_shapes" in takes:
        return [
            (
                "patches with their spatial shape",
                {
                    "pixel_values": pixels,
                    "spatial_shapes": torch.tensor([[side, side]] * batch),
                    "pixel_attention_mask": torch.ones(batch, side * side, dtype=torch.bool),
                },
            )
        ]
    return []


def _flattened(
    config: PretrainedConfig, takes: set[str], batch: int, generator: torch.Generator
) -> Iterator[Layout]:
    """Pix2Struct's and Kosmos-2.5's ``flattened_patches``: each patch's row and column (from
    1), then its ``patch_embed_hidden_size`` pixel values; a 4 x 4 grid of them."""
    vision = first_config_with(config, "patch_embed_hidden_size")
    if "flattened_patches" not in takes or vision is None:
        return
    rows, columns = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    places = torch.stack([rows.flatten() + 1, columns.flatten() + 1], dim=-1).float()
    pixels = _randn(16, vision.patch_embed_hidden_size, generator=generator)
    patches = torch.cat([places, pixels], dim=-1).expand(batch, -1, -1).contiguous()
    media: dict[str, Any] = {"flattened_patches": patches}
    for key in ("width", "height"):
        if key in takes:
            media[key] = torch.full((batch,), 4)
    yield "flattened patches with their places", media


def _tiles_with_mask(
    g: Geometry, takes: set[str], batch: int, generator: torch.Generator
) -> list[Layout]:
    """One tile per image and a mask of its real pixels (Idefics2 and 3), or of its real
    tiles (Granite Docling)."""
    if "pixel_attention_mask" not in takes or "spatial_shapes" in takes:
        return []
    pixels = _randn(batch, 1, g.channels, g.side, g.side, generator=generator)
    real_pixels = torch.ones(batch, 1, g.side, g.side, dtype=torch.bool)
    real_tiles = torch.ones(batch, 1, dtype=torch.bool)
    return [
        (
            "a tile with its pixel mask",
            {"pixel_values": pixels, "pixel_attention_mask": real_pixels},
        ),
        ("a tile with its tile mask", {"pixel_values": pixels, "pixel_attention_mask": real_tiles}),
    ]


def _picture(g: Geometry, takes: set[str], batch: int, generator: torch.Generator) -> list[Layout]:
    """One picture of the tower's own size; with its size where the model takes sizes, cut
    into views where the model reads pictures at any resolution."""
    key = next(
        (k for k in ("pixel_values", "pixel_values_images", "image_pixel_values") if k in takes),
        None,
    )
    if key is None:
        return []
    picture = _randn(batch, g.channels, g.side, g.side, generator=generator)
    if "high_res_pixel_values" in takes and g.high_side:
        high = _randn(batch, g.channels, g.high_side, g.high_side, generator=generator)
        return [("one picture at both resolutions", {key: picture, "high_res_pixel_values": high})]
    if "image_sizes" not in takes:
        return [("one picture", {key: picture})]
    sizes = torch.tensor([[g.side, g.side]] * batch)
    if g.views == 1:
        return [("one picture with its size", {key: picture, "image_sizes": sizes})]
    views = _randn(batch, g.views, g.channels, g.side, g.side, generator=generator)
    return [(f"{g.views} views of a picture with its size", {key: views, "image_sizes": sizes})]


def _flat_patches(
    g: Geometry, takes: set[str], batch: int, generator: torch.Generator
) -> list[Layout]:
    """A picture's patches, each flattened to one row (Fuyu projects them straight in)."""
    if "pixel_values" not in takes:
        return []
    count = (g.side // g.patch) ** 2
    pixels = _randn(batch, count, g.channels * g.patch * g.patch, generator=generator)
    return [("a picture's patches, each flat", {"pixel_values": pixels})]


_IMAGE = (_grid, _positioned, _tiles_with_mask, _picture, _flat_patches)


# ---------------------------------------------------------------- video
def _video_grid(
    g: Geometry, takes: set[str], batch: int, generator: torch.Generator
) -> list[Layout]:
    """Patches of one temporal patch (a clip of ``temporal`` frames) and its grid, else of
    two (ERNIE 4.5-VL merges temporal patches in pairs). One first, since models differ in
    how a longer clip's placeholders are grouped (Qwen3-VL starts each temporal patch anew,
    after its timestamp); a single group is the same in all."""
    if "video_grid_thw" not in takes:
        return []
    side = g.per_side
    found = []
    for frames in (1, 2):
        grids = {"video_grid_thw": torch.tensor([[frames, side, side]] * batch)}
        count = batch * frames * side * side
        found += _patch_layouts(g, "pixel_values_videos", count, grids, takes, "video", generator)
    return found


def _frames(g: Geometry, takes: set[str], batch: int, generator: torch.Generator) -> list[Layout]:
    """Pictures of the tower's size, frame after frame (LLaVA-NeXT-Video, Video-LLaVA)."""
    if "pixel_values_videos" not in takes or {"video_grid_thw", "video_position_ids"} & takes:
        return []
    frames = 2 * g.temporal
    pixels = _randn(batch, frames, g.channels, g.side, g.side, generator=generator)
    return [(f"{frames} frames", {"pixel_values_videos": pixels})]


def _positioned_frames(
    g: Geometry, takes: set[str], batch: int, generator: torch.Generator
) -> list[Layout]:
    """Two frames per clip, each frame's patches with their coordinates, every clip's frames
    in one run and the count per clip to split it by (Gemma 4's video processor's output);
    where the forward takes no count, the clips stacked, frames within each (transformers
    5.17's Gemma 4)."""
    if "video_position_ids" not in takes:
        return []
    frames = 2
    (_, image), *_ = _positioned(g, {"image_position_ids"}, batch * frames, generator)
    pixels, positions = image["pixel_values"], image["image_position_ids"]
    if "num_frames_per_video" not in takes:
        media = {
            "pixel_values_videos": pixels.unflatten(0, (batch, frames)),
            "video_position_ids": positions.unflatten(0, (batch, frames)),
        }
        return [(f"clips of {frames} frames' patches with their positions", media)]
    media = {
        "pixel_values_videos": pixels,
        "video_position_ids": positions,
        "num_frames_per_video": torch.full((batch,), frames),
    }
    return [(f"{frames} frames' patches with their positions", media)]


_VIDEO = (_video_grid, _positioned_frames, _frames)


# ---------------------------------------------------------------- audio
#: Fields naming the features per audio frame (mel bins, filter banks), first found wins.
FEATURE_KEYS = (
    "num_mel_bins",
    "n_mels",
    "feature_size",
    "input_feat_per_channel",
    "input_dim",
    "input_size",
    "feature_projection_input_dim",
)
#: Masks of the real audio frames (or samples), under their names in the models that take one.
AUDIO_MASKS = (
    "input_features_mask",
    "feature_attention_mask",
    "audio_attention_mask",
    "padding_mask",
)


def _audio(
    config: PretrainedConfig, takes: set[str], batch: int, generator: torch.Generator
) -> Iterator[Layout]:
    """A waveform (with a channel axis where the model wants one), mel frames (a Whisper
    encoder's of its fixed length), or frames of features, each with masks of what is real
    where the model takes them."""

    def masks(length: int) -> dict[str, torch.Tensor]:
        return {
            name: torch.ones(batch, length, dtype=torch.long)
            for name in AUDIO_MASKS
            if name in takes
        }

    if "input_values" in takes:
        wave = 0.1 * _randn(batch, WAVEFORM, generator=generator)
        yield "a waveform", {"input_values": wave, **masks(WAVEFORM)}
        yield "a waveform of one channel", {"input_values": wave[:, None], **masks(WAVEFORM)}
    key = next((k for k in ("input_features", "audio_input_features") if k in takes), None)
    found = (
        (k, sub, first_int(vars(sub).get(k)))
        for k in FEATURE_KEYS
        if (sub := first_config_with(config, k))
    )
    field, encoder, features = next(found, (None, None, None))
    if key is None or encoder is None or features is None:
        return
    # low-frame-rate frontends (FunASR's) stack consecutive mel frames into one input frame
    features *= first_int(vars(encoder).get("num_stacked_frames")) or 1
    # a Whisper encoder (mel bins and source positions in one config) takes exactly the frames
    # its two convolutions turn into its positions; elsewhere positions only bound the length
    positions = first_int(vars(encoder).get("max_source_positions"))
    whisper = field == "num_mel_bins" and positions is not None
    frames = 2 * positions if whisper else AUDIO_FRAMES
    mel = _randn(batch, features, frames, generator=generator)
    yield "mel frames", {key: mel, **masks(frames)}
    yield "frames of features", {key: mel.transpose(1, 2).contiguous(), **masks(frames)}
