"""Samples from the model type's own image processor or feature extractor, before the probe's
guessed layouts: what a user's batch holds, from Pillow and numpy alone."""

from __future__ import annotations

import pytest
import torch
import transformers

from llmc_trace.models.build import twin_of_class
from llmc_trace.models.defaults import default_config
from llmc_trace.models.samples import SampleOptions
from llmc_trace.traced.probe import sample_for
from llmc_trace.traced.processed import processed_layouts
from tests.conftest import shipped_types


def twin(model_type: str, class_name: str) -> transformers.PreTrainedModel:
    return twin_of_class(getattr(transformers, class_name), default_config(model_type))


@pytest.mark.usefixtures("one_thread")
def test_an_any_resolution_picture_is_laid_out_by_its_image_processor() -> None:
    """LLaVA-NeXT's processor pads a wide picture's tiles and gives its true size; the probe
    alone lays out square pictures only."""
    model = twin("llava_next", "LlavaNextForConditionalGeneration")
    sample = sample_for(model, "image", SampleOptions(seq_len=16, batch_size=2))
    (height, width), side = sample["image_sizes"][0].tolist(), model.config.vision_config.image_size
    assert (height, width) == (side, side * 3 // 2)
    assert sample["pixel_values"].shape[:2] == (2, 3)  # a base view and two tiles, each row
    with torch.no_grad():  # the placeholders are as many as the model's own features
        model(**sample)


@pytest.mark.usefixtures("one_thread")
@shipped_types("dots3_note")
def test_an_audio_input_only_the_feature_extractor_knows_is_given() -> None:
    """Dots3's audio features need the chunk lengths its feature extractor computes, which no
    layout guessed from the config has."""
    model = twin("dots3_note", "Dots3NoteForConditionalGeneration")
    sample = sample_for(model, "audio", SampleOptions(seq_len=16))
    assert "chunk_sample_lengths" in sample
    with torch.no_grad():
        model(**sample)


@shipped_types("granite_speech_plus", "molmo2")
def test_processors_that_need_what_is_not_installed_give_no_layout() -> None:
    """Granite Speech's extractor needs torchaudio, Molmo2's image processor torchvision:
    nothing is offered, and the probe's own layouts follow."""
    options = SampleOptions(seq_len=16)
    for model_type, modality in (("granite_speech_plus", "audio"), ("molmo2", "image")):
        config = default_config(model_type)
        every = {"input_features", "pixel_values", "image_grids", "image_token_pooling"}
        assert list(processed_layouts(config, modality, every, options)) == []
