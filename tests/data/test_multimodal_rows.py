"""Row layouts of multimodal calibration data, modality detection, and bad input.

The reference for a layout is another layout of the same images and captions: a parquet file
written by `datasets` with an Image column, raw bytes, the Hub's chat layout and inline parts
must all give the batches the `.jsonl` of image paths gives.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.parquet
import pytest
import torch

from llmc_trace.data import (
    DataError,
    load_multimodal_calibration,
    load_processor,
    source_modality,
)
from llmc_trace.errors import BadInputError
from tests.multimodal import load_twin, write_tone

QWEN = "Qwen/Qwen2-VL-2B-Instruct"
AUDIO = "Qwen/Qwen2-Audio-7B-Instruct"


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def assert_same_batches(first, second) -> None:
    assert len(first.batches) == len(second.batches)
    for a, b in zip(first.batches, second.batches):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def load(source, folder, **options):
    settings = {"samples": 4, "seq_len": 256, "batch_size": 2, "shuffle": False} | options
    return load_multimodal_calibration(source, folder, **settings)


# ------------------------------------------------------------------------------ layouts
@pytest.mark.parametrize("embedded", [True, False])
def test_parquet_image_column_as_datasets_writes_it(twins, drawn_rows, tmp_path, embedded):
    """`datasets`' Image column is stored as {"bytes", "path"} structs in parquet: the image
    itself in "bytes", or only its path."""
    import datasets

    rows = read_rows(drawn_rows)
    images = [drawn_rows.parent / row["image"] for row in rows]
    cells = [
        {"bytes": path.read_bytes(), "path": path.name} if embedded else str(path)
        for path in images
    ]
    table = datasets.Dataset.from_dict(
        {"image": cells, "text": [row["text"] for row in rows]}
    ).cast_column("image", datasets.Image())
    path = tmp_path / "rows.parquet"
    table.to_parquet(str(path))
    stored = pyarrow.parquet.read_table(path).column("image").to_pylist()[0]
    assert set(stored) == {"bytes", "path"} and bool(stored["bytes"]) == embedded
    from_parquet = load(path, twins(QWEN))
    assert from_parquet.modality_reason == "image (column 'image')"
    assert_same_batches(from_parquet, load(drawn_rows, twins(QWEN)))


def test_raw_image_bytes(twins, drawn_rows, tmp_path):
    rows = read_rows(drawn_rows)
    path = tmp_path / "bytes.parquet"
    pyarrow.parquet.write_table(
        pyarrow.table(
            {
                "image": [(drawn_rows.parent / row["image"]).read_bytes() for row in rows],
                "caption": [row["text"] for row in rows],
            }
        ),
        path,
    )
    assert_same_batches(load(path, twins(QWEN)), load(drawn_rows, twins(QWEN)))


def test_chat_messages_with_image_parts_and_inline_images(twins, drawn_rows):
    """The Hub's layout (parts + an images column) and llm-compressor's (the image inside its
    part) are the caption layout's conversation."""
    rows = read_rows(drawn_rows)

    def conversation(image_part: dict, text: str) -> list[dict]:
        return [
            {"role": "user", "content": [image_part]},
            {"role": "assistant", "content": [{"type": "text", "text": text}]},
        ]

    hub = write_jsonl(
        drawn_rows.parent / "hub.jsonl",
        [
            {"messages": conversation({"type": "image"}, r["text"]), "images": [r["image"]]}
            for r in rows
        ],
    )
    inline = write_jsonl(
        drawn_rows.parent / "inline.jsonl",
        [
            {"messages": conversation({"type": "image", "image": r["image"]}, r["text"])}
            for r in rows
        ],
    )
    plain = write_jsonl(  # string contents, no parts: the images go first in the user turn
        drawn_rows.parent / "plain.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": ""},
                    {"role": "assistant", "content": r["text"]},
                ],
                "images": [r["image"]],
            }
            for r in rows
        ],
    )
    reference = load(drawn_rows, twins(QWEN))
    assert_same_batches(load(plain, twins(QWEN)), reference)
    from_hub, from_inline = load(hub, twins(QWEN)), load(inline, twins(QWEN))
    assert from_hub.modality_reason == "image (column 'images')"
    assert from_inline.modality_reason == "image ({'type': 'image'} parts of 'messages')"
    assert_same_batches(from_hub, reference)
    assert_same_batches(from_inline, reference)


def test_several_images_per_row(twins, drawn_rows):
    """Two images in one row: two runs of placeholders, each as long as its own grid implies,
    and the batch runs."""
    rows = read_rows(drawn_rows)
    pairs = write_jsonl(
        drawn_rows.parent / "pairs.jsonl",
        [
            {"images": [rows[i]["image"], rows[i + 1]["image"]], "text": rows[i]["text"]}
            for i in (0, 2, 4)
        ],
    )
    folder = twins(QWEN)
    calibration = load(pairs, folder, samples=3, batch_size=3)
    batch = calibration.batches[0]
    assert batch["image_grid_thw"].shape == (6, 3)
    per_image = batch["image_grid_thw"].prod(dim=1) // 4  # merge 2 x 2
    for row in range(3):
        tokens = batch["input_ids"][row] == calibration.media_token_id
        assert int(tokens.sum()) == int(per_image[2 * row] + per_image[2 * row + 1])
    assert calibration.batch_stats[0].media_items == 6
    with torch.no_grad():
        load_twin(folder)(**batch)


def test_prompt_joins_the_image_in_the_user_turn(twins, drawn_rows):
    rows = read_rows(drawn_rows)
    prompted = write_jsonl(
        drawn_rows.parent / "prompted.jsonl",
        [{"image": r["image"], "prompt": "describe this picture", "text": r["text"]} for r in rows],
    )
    calibration = load(prompted, twins(QWEN), samples=1, batch_size=1)
    tokenizer = load_processor(twins(QWEN)).tokenizer
    text = tokenizer.decode(calibration.batches[0]["input_ids"][0])
    assert (
        text.index("<|vision_end|>")
        < text.index("describe this picture")
        < text.index(rows[0]["text"].split()[0])
    )


def test_audio_array_with_rate_equals_the_wav_file(twins, tmp_path):
    """A waveform given as samples and a rate is the same audio as its .wav file; an 8 kHz
    clip is resampled to the extractor's 16 kHz and gets the placeholders of its duration."""
    write_tone(tmp_path / "tone.wav", 1.5, 16000, 440.0)
    write_tone(tmp_path / "low.wav", 1.5, 8000, 440.0)
    with wave.open(str(tmp_path / "tone.wav")) as reader:
        samples = np.frombuffer(reader.readframes(reader.getnframes()), dtype=np.int16) / 32768.0
    wav = write_jsonl(tmp_path / "wav.jsonl", [{"audio": "tone.wav", "text": "one tone ."}])
    array = write_jsonl(
        tmp_path / "array.jsonl",
        [{"audio": {"array": samples.tolist(), "sampling_rate": 16000}, "text": "one tone ."}],
    )
    low = write_jsonl(tmp_path / "low.jsonl", [{"audio": "low.wav", "text": "one tone ."}])
    options = {"samples": 1, "batch_size": 1}
    from_wav = load(wav, twins(AUDIO), **options)
    assert from_wav.modality == "audio"
    assert_same_batches(load(array, twins(AUDIO), **options), from_wav)
    from_low = load(low, twins(AUDIO), **options)
    count = lambda c: int((c.batches[0]["input_ids"] == c.media_token_id).sum())  # noqa: E731
    assert count(from_low) == count(from_wav)
    assert count(from_wav) == (((1.5 * 16000 // 160) - 1) // 2 + 1 - 2) // 2 + 1


def test_several_modalities_need_forcing(twins, drawn_rows, tmp_path):
    rows = read_rows(drawn_rows)
    mixed = write_jsonl(
        drawn_rows.parent / "mixed.jsonl",
        [
            {"image": r["image"], "audio": [0.0] * 160, "sampling_rate": 16000, "text": r["text"]}
            for r in rows
        ],
    )
    with pytest.raises(DataError, match="several modalities"):
        load(mixed, twins(QWEN))
    forced = load(mixed, twins(QWEN), modality="image")
    assert forced.modality_reason == "image (forced; column 'image')"
    assert_same_batches(forced, load(drawn_rows, twins(QWEN)))


# ------------------------------------------------------------------------------ bad input
def one_sentence(err: pytest.ExceptionInfo) -> str:
    message = err.value.message
    assert "\n" not in message and err.value.hint
    return message


def broken_rows(drawn_rows: Path, tmp_path: Path, image: object) -> Path:
    shutil.copytree(drawn_rows.parent / "images", tmp_path / "images")
    rows = read_rows(drawn_rows)
    rows[1]["image"] = image
    return write_jsonl(tmp_path / "rows.jsonl", rows)


def test_missing_image_names_the_row_and_path(twins, drawn_rows, tmp_path):
    rows = broken_rows(drawn_rows, tmp_path, "images/nowhere.png")
    with pytest.raises(DataError) as err:
        load(rows, twins(QWEN))
    assert "row 1" in one_sentence(err) and "images/nowhere.png does not exist" in err.value.message


def test_unreadable_image_path(twins, drawn_rows, tmp_path):
    rows = broken_rows(drawn_rows, tmp_path, "images")
    with pytest.raises(DataError) as err:
        load(rows, twins(QWEN))
    assert "row 1" in one_sentence(err) and "is not a file" in err.value.message


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_image(twins, drawn_rows, tmp_path, damage):
    rows = broken_rows(drawn_rows, tmp_path, "images/bad.png")
    good = (tmp_path / "images/0000.png").read_bytes()
    (tmp_path / "images/bad.png").write_bytes(
        b"not an image" if damage == "garbage" else good[: len(good) // 2]
    )
    with pytest.raises(DataError) as err:
        load(rows, twins(QWEN))
    assert "row 1" in one_sentence(err) and "not an image Pillow can read" in err.value.message


def test_model_folder_without_processor_names_missing_files(twins, drawn_rows, tmp_path):
    folder = shutil.copytree(twins(QWEN), tmp_path / "bare")
    for name in (
        "preprocessor_config.json",
        "processor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        (folder / name).unlink()
    with pytest.raises(BadInputError) as err:
        load(drawn_rows, folder)
    message = one_sentence(err)
    assert "has no processor" in message
    assert "preprocessor_config.json" in message and "tokenizer.json" in message


def test_text_only_model_given_images(saved_llama, drawn_rows):
    folder, _ = saved_llama
    with pytest.raises(DataError) as err:
        load(drawn_rows, folder)
    assert "does not take image (it takes text only)" in one_sentence(err)


def test_images_for_an_audio_model(twins, drawn_rows):
    with pytest.raises(DataError) as err:
        load(drawn_rows, twins(AUDIO))
    assert "does not take image (it takes audio)" in one_sentence(err)


def test_image_tokens_alone_exceed_seq_len(twins, drawn_rows):
    with pytest.raises(DataError) as err:
        load(drawn_rows, twins(QWEN), seq_len=8)
    message = one_sentence(err)
    assert "placeholder tokens alone, more than seq_len=8" in message and "row 0" in message


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed"
)
def test_video_without_torchvision_says_so(twins, drawn_rows):
    rows = read_rows(drawn_rows)
    videos = write_jsonl(
        drawn_rows.parent / "videos.jsonl",
        [{"video": [r["image"], r["image"]], "text": r["text"]} for r in rows],
    )
    with pytest.raises(DataError) as err:
        load(videos, twins(QWEN))
    assert "needs torchvision" in one_sentence(err)


def test_rows_without_media_or_text(twins, drawn_rows, tmp_path):
    captions = write_jsonl(tmp_path / "captions.jsonl", [{"text": "one red circle ."}])
    with pytest.raises(DataError, match="holds no image, video or audio column"):
        load(captions, twins(QWEN))
    images = write_jsonl(tmp_path / "images.jsonl", [{"image": "a.png"}])
    with pytest.raises(DataError, match="has image but no text column"):
        load(images, twins(QWEN))
    with pytest.raises(DataError, match="cannot hold images"):
        np.save(tmp_path / "tokens.npy", np.zeros((2, 8), dtype=np.int64))
        load(tmp_path / "tokens.npy", twins(QWEN))


def test_source_modality_routes_text_and_media(drawn_rows, tmp_path):
    """Text-only sources go to load_calibration (None), media tables to the multimodal loader;
    a forced media modality on a source that cannot hold it is refused."""
    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": "one red circle ."}])
    np.save(tmp_path / "tokens.npy", np.zeros((2, 8), dtype=np.int64))
    assert source_modality(texts) is None
    assert source_modality(tmp_path / "tokens.npy") is None
    assert source_modality(drawn_rows, "text") is None
    assert source_modality(drawn_rows).modality == "image"
    with pytest.raises(DataError, match="cannot hold images"):
        source_modality(tmp_path / "tokens.npy", "image")
    with pytest.raises(DataError, match="has no audio column"):
        source_modality(drawn_rows, "audio")
