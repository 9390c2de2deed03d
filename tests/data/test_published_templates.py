"""Rows laid out for the chat templates models publish, not for a template written here.

Each template in `tests/data/chat_templates` is a published one (`SOURCES.md` names where it
comes from). A family with a tiny twin is calibrated through its published template, and the
media placeholders the processor expands must be those the twin's own template gives (the
processor, not the template, decides how many tokens an image takes); the others are rendered
with rows as the loader builds them, and must put one marker per media item. A template that
does not recognise the rows' media parts is refused in one sentence naming the row.

InternVL's -hf checkpoints publish the conversion script's template with `<IMG_CONTEXT>` where
the kept text writes `<image>` (`SOURCES.md`); Mistral 3's processor class exists in
transformers only with torchvision installed, so without it its twin is refused in one sentence.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

from llmc_trace import CompressRequest, compress
from llmc_trace.data import DataError, load_multimodal_calibration
from llmc_trace.data.rows import RowReader, detect_modality
from llmc_trace.data.tables import read_text_table
from tests.multimodal import load_twin, skip_unless_processable

TEMPLATES = Path(__file__).parent / "chat_templates"

#: built-in twin -> (published template, modality)
THROUGH_TWINS = {
    "Qwen/Qwen2-VL-2B-Instruct": ("qwen2_vl.jinja", "image"),
    "Qwen/Qwen2.5-VL-7B-Instruct": ("qwen2_vl.jinja", "image"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("qwen3_vl.jinja", "image"),
    "llava-hf/llava-1.5-7b-hf": ("llava_1_5.jinja", "image"),
    "HuggingFaceTB/SmolVLM-Instruct": ("smolvlm.jinja", "image"),
    "google/gemma-3-4b-it": ("gemma3.jinja", "image"),
    "Qwen/Qwen2-Audio-7B-Instruct": ("qwen2_audio.jinja", "audio"),
}
#: published template rendered alone -> the marker it writes per image (their twins' tests
#: are below: InternVL's -hf text differs in that marker, Mistral 3's needs torchvision)
RENDERED_ONLY = {"mistral3.jinja": "[IMG]", "internvl.jinja": "<image>"}
RUN = dict(samples=2, seq_len=512, batch_size=2, pipeline="sequential", group_size=32)


def with_template(folder: Path, target: Path, template: str) -> Path:
    shutil.copytree(folder, target)
    (target / "chat_template.jinja").write_text(template)
    return target


def placeholders(calibration) -> list[int]:
    media = calibration.media_token_id
    return [
        int((row == media).sum()) for batch in calibration.batches for row in batch["input_ids"]
    ]


def calibrates_through(name, template, modality, rows, twins, tmp_path) -> None:
    """Twin `name` with `template` in place of its own: the same placeholders as through its own
    template, at least one per sample, and a compression run through it."""
    own = twins(name)
    published = with_template(own, tmp_path / "published", template)
    settings = dict(samples=2, seq_len=512, batch_size=2, shuffle=False, modality=modality)
    through_published = load_multimodal_calibration(rows, published, **settings)
    through_own = load_multimodal_calibration(rows, own, **settings)
    assert placeholders(through_published) == placeholders(through_own)
    assert all(count > 0 for count in placeholders(through_published))

    result = compress(CompressRequest(published, rows, None, modality=modality, **RUN))
    assert result.layers and not result.fallbacks


@pytest.mark.parametrize("name", list(THROUGH_TWINS))
def test_a_twin_calibrates_through_its_published_template(
    name, twins, drawn_rows, tone_rows, tmp_path
):
    template, modality = THROUGH_TWINS[name]
    skip_unless_processable(twins(name), modality)
    rows = tone_rows if modality == "audio" else drawn_rows
    calibrates_through(name, (TEMPLATES / template).read_text(), modality, rows, twins, tmp_path)


def test_internvl_calibrates_through_the_template_its_hf_checkpoints_publish(
    twins, drawn_rows, tmp_path
):
    """InternVLProcessor finds an image by the tokenizer's `context_image_token`, `<IMG_CONTEXT>`
    in the published tokenizer; the conversion script's first text wrote `<image>`, which the
    marker check refuses in one sentence rather than calibrating without the image."""
    name = "OpenGVLab/InternVL3-1B-hf"
    kept = (TEMPLATES / "internvl.jinja").read_text()
    published = kept.replace("'<image>\n'", "'<IMG_CONTEXT>\n'")
    assert "<image>" not in published and published.count("<IMG_CONTEXT>") == 1
    calibrates_through(name, published, "image", drawn_rows, twins, tmp_path)

    with pytest.raises(DataError) as err:
        load_multimodal_calibration(
            drawn_rows, with_template(twins(name), tmp_path / "kept", kept), samples=2,
            seq_len=512, shuffle=False,
        )  # fmt: skip
    message = str(err.value)
    assert "row 0" in message and "wrote 0 image marker(s) (<IMG_CONTEXT>)" in message
    assert "\n" not in message


def test_mistral3_calibrates_through_its_published_template_where_its_processor_exists(
    twins, drawn_rows, tmp_path
):
    """transformers defines Mistral 3's PixtralProcessor only when torchvision is installed (its
    module imports the torchvision image processor); without it the run is one sentence
    saying so, before any model work."""
    name = "mistralai/Ministral-3-3B-Instruct-2512"
    template = (TEMPLATES / "mistral3.jinja").read_text()
    if importlib.util.find_spec("torchvision") is not None:
        calibrates_through(name, template, "image", drawn_rows, twins, tmp_path)
        return
    with pytest.raises(DataError) as err:
        load_multimodal_calibration(
            drawn_rows, with_template(twins(name), tmp_path / "published", template),
            samples=2, seq_len=512, shuffle=False,
        )  # fmt: skip
    message = str(err.value)
    assert "defines its PixtralProcessor only when torchvision is installed" in message
    assert "Install torchvision" in message and "\n" not in message
    # the twin itself is ready for it: float weights, without the published FP8 storage format
    assert "quantization_config" not in load_twin(twins(name)).config.to_dict()


def test_qwen3_vl_template_is_the_bytes_its_source_pins():
    """`SOURCES.md`: the source pins Qwen3-VL-Instruct's published template by size and hash;
    the kept copy must be those bytes, not a retyped or reformatted text."""
    data = (TEMPLATES / "qwen3_vl.jinja").read_bytes()
    assert len(data) == 5292
    assert hashlib.sha256(data).hexdigest() == (
        "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"
    )


@pytest.mark.parametrize("name", list(RENDERED_ONLY))
def test_published_templates_rendered_alone_write_one_marker_per_image(name, drawn_rows):
    table = read_text_table(drawn_rows, "jsonl", "captions.jsonl")
    reader = RowReader(table, detect_modality(table), base=drawn_rows.parent, target_rate=None)
    (row,) = reader.read(0)
    render = _compile_jinja_template((TEMPLATES / name).read_text()).render
    text = render(messages=row.messages, bos_token="<s>", eos_token="</s>")
    assert text.count(RENDERED_ONLY[name]) == len(row.images) == 1
    assert row.messages[-1]["content"][0]["text"] in text  # the caption is the answer


def test_qwen2_audio_rows_keep_the_audio_key_its_template_looks_for(twins, tone_rows, tmp_path):
    """The published Qwen2-Audio template finds an audio part by its `audio` key alone."""
    folder = twins("Qwen/Qwen2-Audio-7B-Instruct")
    published = with_template(
        folder, tmp_path / "published", (TEMPLATES / "qwen2_audio.jinja").read_text()
    )
    calibration = load_multimodal_calibration(
        tone_rows, published, samples=2, seq_len=512, batch_size=1, shuffle=False
    )
    assert all(count > 0 for count in placeholders(calibration))


def test_a_template_that_drops_markers_is_named_in_one_sentence(twins, tone_rows, tmp_path):
    folder = twins("Qwen/Qwen2-Audio-7B-Instruct")
    broken = (
        (TEMPLATES / "qwen2_audio.jinja")
        .read_text()
        .replace("'audio' in content or 'audio_url' in content", "'audio_url' in content")
    )
    assert broken != (TEMPLATES / "qwen2_audio.jinja").read_text()
    with pytest.raises(DataError) as err:
        load_multimodal_calibration(
            tone_rows, with_template(folder, tmp_path / "broken", broken), samples=2,
            seq_len=512, shuffle=False,
        )  # fmt: skip
    message = str(err.value)
    assert "row 0" in message and "chat template wrote 0 audio marker(s)" in message
    assert "for the row's 1 audio item(s)" in message and "\n" not in message
