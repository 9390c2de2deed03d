"""Samples for architectures no builder knows: which media a model takes, read from its forward,
and how many placeholders its own feature method asks for (``traced/probe.py``)."""

from __future__ import annotations

import pytest
import torch
import transformers

from llmc_trace.errors import BadInputError
from llmc_trace.models.build import build_meta_model_of, twin_of_class
from llmc_trace.models.defaults import default_config
from llmc_trace.models.samples import SampleOptions, supported_modalities
from llmc_trace.traced.probe import UnfitConfig, _feature_rows, sample_for
from tests.conftest import default_builds, shipped_types

SHORT = SampleOptions(seq_len=16)


def twin_of(model_type: str, class_name: str) -> torch.nn.Module:
    return twin_of_class(getattr(transformers, class_name), default_config(model_type))


@pytest.mark.parametrize(
    ("model_type", "class_name", "modalities"),
    [
        ("whisper", "WhisperForConditionalGeneration", ["audio"]),  # no token ids at all
        ("instructblip", "InstructBlipForConditionalGeneration", ["image"]),  # pixels required
        pytest.param(
            "vision-encoder-decoder",
            "VisionEncoderDecoderModel",
            ["image"],
            marks=default_builds("vision-encoder-decoder"),
        ),
        ("qwen2_vl", "Qwen2VLForConditionalGeneration", ["text", "image", "video"]),
        ("voxtral", "VoxtralForConditionalGeneration", ["text", "audio"]),
        ("llama", "LlamaForCausalLM", ["text"]),
    ],
)
def test_the_modalities_are_the_media_a_forward_takes(
    model_type: str, class_name: str, modalities: list[str]
) -> None:
    cls = getattr(transformers, class_name)
    assert supported_modalities(default_config(model_type), cls) == modalities


@pytest.mark.usefixtures("one_thread")
def test_placeholders_are_as_many_as_the_model_makes_features_at_either_size() -> None:
    """LLaVA's CLIP tower at 336 pixels gives 24 x 24 patch features (its CLS dropped); the
    twin's at 168 pixels 12 x 12: the probe finds each on the model itself, the full-size one
    on meta, and the twin's forward takes its sample."""
    config = default_config("llava")
    image = config.image_token_id
    full = build_meta_model_of(transformers.LlavaForConditionalGeneration, config)
    assert int((sample_for(full, "image", SHORT)["input_ids"] == image).sum()) == 24 * 24
    twin = twin_of("llava", "LlavaForConditionalGeneration")
    sample = sample_for(twin, "image", SHORT)
    assert int((sample["input_ids"] == twin.config.image_token_id).sum()) == 12 * 12
    with torch.no_grad():
        twin(**sample)


@pytest.mark.usefixtures("one_thread")
def test_placeholders_are_as_many_as_the_forward_places_where_the_method_says_fewer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers 5.17's LLaVA-OneVision forward appends a newline row to each video's
    features after ``get_video_features`` returns (5.24's method appends it): a feature method
    one row short, simulated here, still gives a sample the forward takes, with as many
    placeholders as it places, both on the full-size model on meta and on the twin."""
    from llmc_trace.traced import probe

    def one_short(method, media):  # type: ignore[no-untyped-def]
        rows, width = _feature_rows(method, media)
        return rows - 1, width

    video = default_config("llava_onevision").video_token_id
    cls = transformers.LlavaOnevisionForConditionalGeneration
    full = build_meta_model_of(cls, default_config("llava_onevision"))
    twin = twin_of("llava_onevision", "LlavaOnevisionForConditionalGeneration")
    expected = [
        int((sample_for(m, "video", SHORT)["input_ids"] == video).sum()) for m in (full, twin)
    ]
    monkeypatch.setattr(probe, "_feature_rows", one_short)
    for model, count in zip((full, twin), expected, strict=True):
        sample = sample_for(model, "video", SHORT)
        assert int((sample["input_ids"] == video).sum()) == count
    with torch.no_grad():
        twin(**sample)


def test_positioned_frames_come_stacked_per_clip_where_no_frame_count_is_taken() -> None:
    """Gemma 4's video processor gives every clip's frames in one run with a count per clip
    (5.24's forward takes ``num_frames_per_video``); transformers 5.17's takes the clips
    stacked, frames within each, and no count: each release gets its own layout of the same
    patches."""
    from llmc_trace.traced.layouts import layouts

    from llmc_trace.models.source import resolve_model

    config = resolve_model("google/gemma-4-26B-A4B").config()
    taken = {"input_ids", "pixel_values_videos", "video_position_ids"}

    def video(accepted: set[str]) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        [(_, media)] = list(layouts(config, "video", accepted, SHORT, generator))
        return media

    run = video(taken | {"num_frames_per_video"})
    stacked = video(taken)
    assert run["num_frames_per_video"].tolist() == [2] and "num_frames_per_video" not in stacked
    for key in ("pixel_values_videos", "video_position_ids"):
        assert stacked[key].shape[:2] == (1, 2)
        assert torch.equal(stacked[key].flatten(0, 1), run[key])


@pytest.mark.usefixtures("one_thread")
def test_an_any_resolution_model_gets_the_views_of_its_pinpoints() -> None:
    """LLaVA-NeXT cuts a picture into a base view and the tiles of its best pinpoint; the twin's
    pinpoints shrink with its images, so a square picture is the base view and two tiles."""
    twin = twin_of("llava_next", "LlavaNextForConditionalGeneration")
    sample = sample_for(twin, "image", SHORT)
    assert sample["pixel_values"].shape[:2] == (1, 3)
    with torch.no_grad():
        twin(**sample)


@pytest.mark.parametrize(
    ("model_type", "class_name", "modality", "said"),
    [
        # Gemma 4's default config builds no vision tower; its forward takes pixels all the same
        ("gemma4", "Gemma4ForConditionalGeneration", "image", "has no image encoder"),
        # Voxtral's default config leaves the audio token unset
        ("voxtral", "VoxtralForConditionalGeneration", "audio", "leaves audio_token_id unset"),
        # Qwen3-VL's default vision tower outputs 3584 wide; its text model is 4096 wide
        ("qwen3_vl", "Qwen3VLForConditionalGeneration", "image", "3584 wide"),
    ],
)
def test_a_config_that_cannot_take_a_medium_is_told_apart(
    model_type: str, class_name: str, modality: str, said: str
) -> None:
    full = build_meta_model_of(getattr(transformers, class_name), default_config(model_type))
    with pytest.raises(UnfitConfig, match=said):
        sample_for(full, modality, SHORT)


@shipped_types("molmo2")
def test_a_feature_method_that_takes_no_layout_names_each_it_tried() -> None:
    """Molmo 2's image features need its processor's pooling tables, which no config holds."""
    twin = twin_of("molmo2", "Molmo2ForConditionalGeneration")
    with pytest.raises(BadInputError, match="took none of the layouts tried: one picture"):
        sample_for(twin, "image", SHORT)


class _FramesAsPixelValues(torch.nn.Module):
    """A feature method naming a video's frames ``pixel_values`` where the forward calls them
    ``pixel_values_videos`` (transformers 5.17's LLaVA-OneVision and LLaVA-NeXT-Video)."""

    def get_video_features(self, pixel_values: torch.Tensor, vision_feature_layer: int = -1):
        return pixel_values.flatten(0, 1).flatten(1)  # one row per frame


def test_the_feature_method_gets_the_frames_under_its_own_name() -> None:
    frames = torch.ones(2, 3, 4, 5)  # 2 frames of 3 x 4 x 5
    media = {"pixel_values_videos": frames.unsqueeze(0), "video_grid": torch.tensor([1, 2])}
    rows, width = _feature_rows(_FramesAsPixelValues().get_video_features, media)
    assert (rows, width) == (2, 60)


def test_two_unnamed_pixel_inputs_are_not_guessed_between() -> None:
    media = {"pixel_values_videos": torch.ones(1, 2, 3), "pixel_values_images": torch.ones(1, 2)}
    with pytest.raises(TypeError, match="pixel_values"):
        _feature_rows(_FramesAsPixelValues().get_video_features, media)
