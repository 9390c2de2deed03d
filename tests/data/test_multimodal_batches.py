"""Multimodal calibration batches on the tiny twins of six architectures, saved with processors.

References computed another way: the placeholder tokens of each row against what the vision
tower or audio encoder gives for its media (the grid, the tiles, the frames), and each row's
logits in a padded batch of differently sized images against the same row run alone.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

from llmc_trace.data import load_multimodal_calibration, load_processor
from llmc_trace.errors import DataError
from tests.multimodal import TWINS, load_twin, skip_unless_processable


def expected_placeholders(config, batch: dict[str, torch.Tensor], row: int) -> int:
    """The placeholder tokens row `row` (holding one media item) must have, from its media
    tensors and the config: what the tower produces, not what the processor wrote."""
    model_type = config["model_type"]
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        merge = config["vision_config"]["spatial_merge_size"]
        return int(batch["image_grid_thw"][row].prod()) // merge**2
    if model_type == "llava":
        vision = config["vision_config"]
        patches = (vision["image_size"] // vision["patch_size"]) ** 2
        return patches + (1 if config["vision_feature_select_strategy"] == "full" else 0)
    if model_type == "idefics3":
        tiles = batch["pixel_attention_mask"][row].flatten(1).any(1).sum()  # padding tiles: 0
        return int(tiles) * config["image_seq_len"]
    if model_type == "gemma3":
        return config["mm_tokens_per_image"]
    if model_type == "qwen2_audio":
        frames = int(batch["feature_attention_mask"][row].sum())
        after_conv = (frames - 1) // 2 + 1  # the encoder's stride-2 convolution
        return (after_conv - 2) // 2 + 1  # then its average pooling
    raise AssertionError(model_type)


@pytest.mark.parametrize("name", list(TWINS))
def test_batches_run_and_match_each_row_alone(name, twins, drawn_rows, tone_rows):
    """Batches of three rows (different image sizes, different lengths, right padding) run
    through the twin's eager forward and give each row the logits it has alone."""
    folder = twins(name)
    skip_unless_processable(folder, TWINS[name])
    rows = tone_rows if TWINS[name] == "audio" else drawn_rows
    config = json.loads((folder / "config.json").read_text())
    together = load_multimodal_calibration(rows, folder, samples=3, seq_len=512, batch_size=3)
    alone = load_multimodal_calibration(rows, folder, samples=3, seq_len=512, batch_size=1)
    assert together.modality == TWINS[name]
    assert (together.shortened, together.dropped) == (0, 0)
    placeholder = together.media_token_id
    model = load_twin(folder)
    batch = together.batches[0]
    with torch.no_grad():
        logits = model(**batch).logits
        for row, single in enumerate(alone.batches):
            count = int(single["attention_mask"].sum())
            assert int((single["input_ids"] == placeholder).sum()) == expected_placeholders(
                config, single, 0
            )
            assert torch.equal(batch["input_ids"][row, :count], single["input_ids"][0])
            assert batch["attention_mask"][row, count:].sum() == 0
            torch.testing.assert_close(
                logits[row, :count], model(**single).logits[0], atol=1e-4, rtol=1e-4
            )
    assert together.batch_stats[0].placeholder_tokens == sum(
        int((b["input_ids"] == placeholder).sum()) for b in alone.batches
    )


def test_three_image_sizes_in_one_calibration_set(twins, drawn_rows):
    """Qwen2-VL's images of three sizes in one batch: three different grids, their patches
    concatenated in row order, as the vision tower splits them again."""
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    calibration = load_multimodal_calibration(
        drawn_rows, folder, samples=6, seq_len=512, batch_size=6, shuffle=False
    )
    batch = calibration.batches[0]
    grids = batch["image_grid_thw"]
    assert len({tuple(grid.tolist()) for grid in grids}) == 3
    assert batch["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())
    config = json.loads((folder / "config.json").read_text())
    for row in range(6):
        assert int((batch["input_ids"][row] == calibration.media_token_id).sum()) == (
            expected_placeholders(config, batch, row)
        )
    with torch.no_grad():
        assert load_twin(folder)(**batch).logits.isfinite().all()


def test_same_seed_same_batches_and_seed_changes_order(twins, drawn_rows):
    folder = twins("google/gemma-3-4b-it")

    def load(seed: int):
        return load_multimodal_calibration(
            drawn_rows, folder, samples=4, seq_len=256, batch_size=2, seed=seed
        )

    first, again, other = load(0), load(0), load(1)
    for a, b in zip(first.batches, again.batches):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(
        not torch.equal(a["pixel_values"], b["pixel_values"])
        for a, b in zip(first.batches, other.batches)
    )


def test_long_sample_loses_text_never_image_tokens(twins, drawn_rows):
    """At a seq_len shorter than a row, the answer's last words go; every image token, the
    vision markers and the chat-turn markers stay, in order, and the batch still runs."""
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    full = load_multimodal_calibration(drawn_rows, folder, samples=1, seq_len=512, shuffle=False)
    tokenizer = load_processor(folder).tokenizer
    special = torch.tensor([i for i, t in tokenizer.added_tokens_decoder.items() if t.special])
    ids = full.batches[0]["input_ids"][0]
    seq_len = len(ids) - 3
    short = load_multimodal_calibration(
        drawn_rows, folder, samples=1, seq_len=seq_len, shuffle=False
    )
    cut = short.batches[0]["input_ids"][0]
    assert (len(cut), short.shortened, short.dropped) == (seq_len, 1, 0)
    assert torch.equal(cut[torch.isin(cut, special)], ids[torch.isin(ids, special)])
    assert torch.equal(cut[~torch.isin(cut, special)], ids[~torch.isin(ids, special)][:-3])
    image = full.media_token_id
    assert torch.equal(short.batches[0]["mm_token_type_ids"][0], (cut == image).long())
    with torch.no_grad():
        load_twin(folder)(**short.batches[0])


def test_rows_that_cannot_fit_are_dropped_and_counted(twins, drawn_rows):
    """At a seq_len that holds every image's tokens but not, for the larger images, their
    markers and chat-turn tokens too, those rows are dropped and counted, the others kept."""
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    full = load_multimodal_calibration(
        drawn_rows, folder, samples=6, seq_len=512, batch_size=1, shuffle=False
    )
    tokenizer = load_processor(folder).tokenizer
    special = torch.tensor([i for i, t in tokenizer.added_tokens_decoder.items() if t.special])
    image = full.media_token_id
    seq_len = max(int((b["input_ids"] == image).sum()) for b in full.batches)
    protected = [int(torch.isin(b["input_ids"], special).sum()) for b in full.batches]
    fits = [count <= seq_len for count in protected]
    fitting = [b for b, fit in zip(full.batches, fits) if fit]
    assert 0 < len(fitting) < len(full.batches)
    calibration = load_multimodal_calibration(
        drawn_rows, folder, samples=len(fitting), seq_len=seq_len, shuffle=False
    )
    last = max(row for row, fit in enumerate(fits) if fit)  # the loader stops there
    assert calibration.dropped == fits[:last].count(False) > 0
    for kept, reference in zip(calibration.batches, fitting):
        assert torch.equal(kept["image_grid_thw"], reference["image_grid_thw"])
        assert int((kept["input_ids"] == image).sum()) == int(
            (reference["input_ids"] == image).sum()
        )


def test_too_few_rows_with_every_row_kept_does_not_advise_a_longer_seq_len(twins, drawn_rows):
    """Each media row is one sample: with every row kept, a longer seq_len cannot give more,
    and the refusal does not suggest it (nor a count of zero rows dropped)."""
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    with pytest.raises(DataError) as every_row_kept:
        load_multimodal_calibration(drawn_rows, folder, samples=7, seq_len=512, shuffle=False)
    said = f"{every_row_kept.value.message} {every_row_kept.value.hint}"
    assert "gives only 6 samples" in said and "Ask for at most 6 samples, or use more" in said
    assert "seq_len," not in said and "dropped" not in said


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None,
    reason="with torchvision installed, AutoProcessor builds Qwen2-VL's processor itself",
)
def test_qwen2_vl_processor_is_built_from_parts_without_torchvision(twins):
    loaded = load_processor(twins("Qwen/Qwen2-VL-2B-Instruct"))
    assert loaded.built_from == "parts"
    assert loaded.modalities == ("image", "video")
    assert "torchvision" in loaded.unavailable["video"]
    assert type(loaded.processor.image_processor).__name__.endswith("Pil")


def test_an_auto_class_that_refuses_without_torchvision_gives_way_to_the_pil_class(
    twins, monkeypatch
):
    """transformers 5.17's AutoImageProcessor refuses, without torchvision, before it reads the
    folder, though the PIL class it names is there: the processor is built from that class."""
    from transformers import AutoImageProcessor

    def refuse(*args, **kwargs):
        raise ImportError("AutoImageProcessor requires the Torchvision library")

    try:
        monkeypatch.setattr(AutoImageProcessor, "from_pretrained", refuse)
    except ImportError:
        pass  # this transformers' AutoImageProcessor refuses already: 5.17 without torchvision
    loaded = load_processor(twins("Qwen/Qwen2-VL-2B-Instruct"))
    assert loaded.built_from == "parts" and "image" in loaded.modalities
    assert "image" not in loaded.unavailable
    assert type(loaded.processor.image_processor).__name__ == "Qwen2VLImageProcessorPil"


@pytest.mark.parametrize("name", ["Qwen/Qwen2-VL-2B-Instruct", "llava-hf/llava-1.5-7b-hf"])
def test_without_a_chat_template_the_image_marker_is_written_in_the_text(
    name, twins, drawn_rows, tmp_path
):
    """A processor without a chat template still gets one marker per image in the text, which
    it expands as with the template: the same placeholder count, and the batch runs."""
    folder = shutil.copytree(twins(name), tmp_path / "plain")
    (folder / "chat_template.jinja").unlink()
    assert not getattr(load_processor(folder).processor, "chat_template", None)
    plain = load_multimodal_calibration(drawn_rows, folder, samples=2, seq_len=512, batch_size=2)
    templated = load_multimodal_calibration(
        drawn_rows, twins(name), samples=2, seq_len=512, batch_size=2
    )
    image = plain.media_token_id
    assert torch.equal(
        (plain.batches[0]["input_ids"] == image).sum(dim=1),
        (templated.batches[0]["input_ids"] == image).sum(dim=1),
    )
    with torch.no_grad():
        load_twin(folder)(**plain.batches[0])
