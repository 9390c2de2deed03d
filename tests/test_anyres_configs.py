"""LLaVA-NeXT and LLaVA-OneVision on configs unlike their defaults, with batches unlike the
twin's: the fix search must find and prove its fixes there too, with or without the fix the
shipped sweep verified for the type on the default config (which only seeds the search).

The configs are small as transformers' own tests build them (8- or 16-pixel tiles, 4- or
8-pixel patches, their own grid pinpoints), and each batch holds two images of different
sizes, padded to the larger image's tile count as the image processors pad them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import (
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    PreTrainedModel,
)

from llmc_trace import trace_subgraphs
from llmc_trace.traced import settle
from llmc_trace.cli.main import cli
from llmc_trace.graph.verify import replay
from llmc_trace.traced.model import trace_model
from llmc_trace.traced.twin import verify_instance
from llmc_trace.tracing.options import TracingOptions

TEXT = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=37,
    max_position_embeddings=512,
    pad_token_id=1,
)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def llava_next() -> LlavaNextConfig:
    """A CLIP tower of 16-pixel tiles cut into 8-pixel patches, three pinpoints (the default:
    336 pixels, 14-pixel patches, five square-ish pinpoints)."""
    return LlavaNextConfig(
        text_config={"model_type": "llama", **TEXT},
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": 16,
            "patch_size": 8,
            "projection_dim": 32,
            **VISION,
        },
        image_token_index=3,
        image_grid_pinpoints=[[32, 32], [16, 32], [32, 16]],
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )


def llava_onevision() -> LlavaOnevisionConfig:
    """A SigLIP tower of 8-pixel tiles and 4-pixel patches over a Qwen2 text model, any
    resolution up to a 2 x 2 grid (the default: 384 pixels, a 6 x 6 grid)."""
    return LlavaOnevisionConfig(
        text_config={"model_type": "qwen2", **TEXT},
        vision_config={
            "model_type": "siglip_vision_model",
            "image_size": 8,
            "patch_size": 4,
            **VISION,
        },
        image_token_index=3,
        video_token_index=4,
        image_grid_pinpoints=[[8, 16], [16, 8], [16, 16]],
        vision_aspect_ratio="anyres_max_4",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )


FAMILIES = {
    "llava_next": (llava_next, LlavaNextForConditionalGeneration, "LlavaNextModel"),
    "llava_onevision": (
        llava_onevision,
        LlavaOnevisionForConditionalGeneration,
        "LlavaOnevisionModel",
    ),
}
#: What the search finds for both: the per-image tile count and the packing of tiles into
#: rows, both sized by the image sizes, each recorded as one call.
FIX = ["image_size_to_num_patches", "{model}.pack_image_features"]


def model_and_batch(family: str) -> tuple[PreTrainedModel, dict[str, torch.Tensor]]:
    """The family's twin and a batch of two images of different sizes, one placeholder per row
    the model's own ``get_image_features`` gives each image."""
    make_config, cls, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(make_config()).eval()
    tile = model.config.vision_config.image_size
    sizes = torch.tensor([[tile * 2 - 3, tile + 1], [tile, tile * 2]])
    module = __import__(type(model).__module__, fromlist=["image_size_to_num_patches"])
    tiles = [
        module.image_size_to_num_patches(s.tolist(), model.config.image_grid_pinpoints, tile)
        for s in sizes
    ]
    pixels = torch.zeros(2, max(tiles), 3, tile, tile)
    for row, count in enumerate(tiles):
        pixels[row, :count] = torch.randn(count, 3, tile, tile)
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=pixels,
            image_sizes=sizes,
            vision_feature_layer=model.config.vision_feature_layer,
            vision_feature_select_strategy=model.config.vision_feature_select_strategy,
        )
    rows = [len(f) for f in getattr(features, "pooler_output", features)]
    length = max(rows) + 8
    ids = torch.randint(5, 99, (2, length))
    mask = torch.ones_like(ids)
    for row, count in enumerate(rows):  # left padding, as a padded batch has it
        pad = length - 4 - count
        ids[row, :pad], mask[row, :pad] = 1, 0
        ids[row, pad + 2 : pad + 2 + count] = model.config.image_token_index
    batch = {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "image_sizes": sizes}
    return model, batch


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "searched"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_fix_is_found_and_proved_on_a_config_unlike_the_default(
    family: str, seeded: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``trace_subgraphs(fix=True)`` traces both families on a non-default config and a batch
    of two image sizes, whether or not the sweep's fix for the type is offered first; the
    subgraphs replay as the model's own forward on the batch."""
    if not seeded:
        monkeypatch.setattr(settle, "swept_fix", lambda model_type, modality: [])
    model, batch = model_and_batch(family)
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        subgraphs = trace_subgraphs(model, batch, fix=True)
    model_class = FAMILIES[family][2]
    # seeded: the sweep's own fix for the type (made on the processor's sample) holds here too
    expected = (
        settle.swept_fix(family, "image") if seeded else [f.format(model=model_class) for f in FIX]
    )
    assert expected and all(entry in caplog.text for entry in expected)
    assert ("coverage --all" in caplog.text) == seeded
    with torch.no_grad():
        expected = model(**batch, use_cache=False).logits
        torch.testing.assert_close(replay(model, subgraphs, batch).logits, expected)


@pytest.mark.usefixtures("one_thread")
def test_a_seed_that_moves_the_failure_on_is_continued_by_the_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seed that fixes only the first failure is kept, and the search fixes the next one
    from where the seed left it; a seed that cannot be installed is reported and skipped."""
    model, batch = model_and_batch("llava_next")
    options = TracingOptions.parse(model, [], None)
    traced = trace_model(model, batch, options, name="next")
    for seed, first_outcome in (
        (["image_size_to_num_patches"], "fails further on"),
        (["NoSuchModel.no_such_method"], "refused"),
    ):
        monkeypatch.setattr(settle, "swept_fix", lambda model_type, modality, s=seed: s)
        settled = settle.settle(traced, verify_instance, fix=True)
        assert settled.attempt.ok
        assert settled.tried[0].tracing_ignore == seed and settled.tried[0].outcome == first_outcome
        assert settled.applied is not None
        assert settled.applied.tracing_ignore == [f.format(model="LlavaNextModel") for f in FIX]


@pytest.mark.usefixtures("one_thread")
def test_a_twin_whose_sample_takes_another_path_defers_to_the_callers_batch() -> None:
    """Tiles flattened into one 4-D batch trace another graph than the twin's 5-D sample: the
    twin cannot prove it, so the model is replayed on the caller's batch instead."""
    model, batch = model_and_batch("llava_next")
    tiles = batch["pixel_values"].flatten(0, 1)
    flat = {**batch, "pixel_values": tiles[tiles.flatten(1).any(dim=1)]}  # padding dropped
    entries = [f.format(model="LlavaNextModel") for f in FIX]
    options = TracingOptions.parse(model, entries, None)
    for sample, proved_on in ((batch, "tiny twin"), (flat, "the sample")):
        check = verify_instance(trace_model(model, sample, options, name="next"))
        assert check.ok and check.verified_on == proved_on


#: What ``attempt --fix`` needs on the sample the type's own image processor lays out:
#: OneVision's processor adds ``batch_num_images``, which ``get_image_features`` loops over.
CLI_FIX = {
    "llava_next": FIX,
    "llava_onevision": ["{model}.get_image_features"],
}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", FAMILIES)
def test_attempt_fix_on_a_config_unlike_the_default(family: str, tmp_path: Path) -> None:
    """``attempt --fix`` on a folder holding the non-default config verifies with the fix."""
    make_config, cls, model_class = FAMILIES[family]
    config = make_config()
    config.architectures = [cls.__name__]
    config.save_pretrained(tmp_path)
    result = CliRunner().invoke(
        cli, ["--quiet", "attempt", "-m", str(tmp_path), "--modality", "image", "--fix", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["applied_fix"]["ignore"] == [f.format(model=model_class) for f in CLI_FIX[family]]
