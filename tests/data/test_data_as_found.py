"""Data as users download it: caption lists, save_to_disk folders and .arrow files, URLs, a
named text column, oversize samples, and evaluation of a short text."""

from __future__ import annotations

import json
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import datasets
import pytest
import torch

from llmc_trace import CompressRequest, compress
from llmc_trace.data import (
    DataError,
    load_calibration,
    load_multimodal_calibration,
)
from llmc_trace.data.columns import Columns
from llmc_trace.evaluate import evaluate_model

QWEN = "Qwen/Qwen2-VL-2B-Instruct"
CAPTIONS = [
    "one purple triangle in the middle .",
    "a yellow square on white .",
    "three orange circles .",
]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def caption_lists(drawn_rows: Path) -> datasets.Dataset:
    """The drawn rows as flickr30k lays them out: an Image column, five-ish captions a row."""
    rows = read_rows(drawn_rows)
    return datasets.Dataset.from_dict(
        {
            "image": [str(drawn_rows.parent / row["image"]) for row in rows],
            "caption": [[row["text"], *CAPTIONS] for row in rows],
        }
    ).cast_column("image", datasets.Image())


def answers(calibration, tokenizer) -> list[str]:
    return [tokenizer.decode(row) for batch in calibration.batches for row in batch["input_ids"]]


def test_caption_lists_calibrate_on_the_first_caption_and_say_so(twins, drawn_rows, tmp_path):
    folder = twins(QWEN)
    parquet = tmp_path / "flickr.parquet"
    caption_lists(drawn_rows).to_parquet(str(parquet))
    settings = dict(samples=4, seq_len=256, batch_size=2, shuffle=False)
    calibration = load_multimodal_calibration(parquet, folder, **settings)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = answers(calibration, tokenizer)
    firsts = [row["text"] for row in read_rows(drawn_rows)[:4]]
    assert all("['" not in text and '["' not in text for text in texts)
    assert all(first.rstrip(" .") in text for first, text in zip(firsts, texts))
    assert not any(CAPTIONS[0].rstrip(" .") in text for text in texts)
    assert any(
        "holds lists of texts" in note and "the first text" in note for note in calibration.notes
    )

    each = load_multimodal_calibration(
        parquet, folder, columns=Columns(text_lists="each"), **(settings | {"samples": 8})
    )
    assert each.num_samples == 8 and each.batch_stats[0].num_samples == 2
    joined = load_multimodal_calibration(
        parquet, folder, columns=Columns(text_lists="joined"), **settings
    )
    assert all(CAPTIONS[1].rstrip(" .") in text for text in answers(joined, tokenizer))


def test_evaluate_scores_each_text_of_every_list_by_default(twins, drawn_rows, tmp_path):
    """With --text-lists each, a row of four captions is four samples: evaluate's default
    ("every row") counts them, where it counted the table's rows and scored a quarter."""
    folder = twins(QWEN)
    parquet = tmp_path / "flickr.parquet"
    caption_lists(drawn_rows).to_parquet(str(parquet))
    each = Columns(text_lists="each")
    every = load_multimodal_calibration(
        parquet, folder, columns=each, samples=None, seq_len=256, shuffle=False
    )
    assert every.num_samples == len(read_rows(drawn_rows)) * (1 + len(CAPTIONS))
    settings = dict(columns=each, seq_len=256, dtype=torch.float32)
    by_default = evaluate_model(folder, parquet, **settings)
    asked = evaluate_model(folder, parquet, samples=every.num_samples, **settings)
    assert (by_default.num_tokens, by_default.perplexity) == (asked.num_tokens, asked.perplexity)


def test_a_save_to_disk_folder_and_an_arrow_file_calibrate(twins, drawn_rows, tmp_path):
    folder = twins(QWEN)
    saved = tmp_path / "saved"
    caption_lists(drawn_rows).save_to_disk(str(saved))
    parquet = tmp_path / "same.parquet"
    caption_lists(drawn_rows).to_parquet(str(parquet))
    settings = dict(samples=4, seq_len=256, batch_size=2, shuffle=False)
    reference = load_multimodal_calibration(parquet, folder, **settings)
    for source in (saved, next(saved.glob("*.arrow"))):
        calibration = load_multimodal_calibration(source, folder, **settings)
        for ours, theirs in zip(calibration.batches, reference.batches):
            assert all((ours[key] == theirs[key]).all() for key in theirs)
    result = compress(
        CompressRequest(folder, str(saved), None, samples=2, seq_len=256, batch_size=2,
                        pipeline="sequential", group_size=32)
    )  # fmt: skip
    assert result.layers and any("tokens" in note for note in result.data_notes)


def test_a_hub_dataset_with_an_image_column_is_read_through_datasets(
    twins, drawn_rows, monkeypatch
):
    """The Hub itself is not reachable here: `load_dataset` is given the dataset it would
    download, and the rows must read as the same dataset saved locally does."""
    dataset = caption_lists(drawn_rows)
    calls = []

    def load_dataset(hub_id, subset=None, split=None):
        calls.append((hub_id, subset, split))
        return dataset

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    calibration = load_multimodal_calibration(
        "nlphuji/flickr30k", twins(QWEN), samples=2, seq_len=256, modality="image", shuffle=False
    )
    assert calls == [("nlphuji/flickr30k", None, "train")] and calibration.num_samples == 2


def test_an_image_url_is_fetched_and_an_unreachable_one_is_one_sentence(
    twins, drawn_rows, tmp_path
):
    rows = read_rows(drawn_rows)[:2]
    handler = partial(SimpleHTTPRequestHandler, directory=str(drawn_rows.parent))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        served = tmp_path / "served.jsonl"
        served.write_text(
            "".join(json.dumps({**r, "image": base + r["image"]}) + "\n" for r in rows)
        )
        local = tmp_path / "local.jsonl"
        local.write_text(
            "".join(
                json.dumps({**r, "image": str(drawn_rows.parent / r["image"])}) + "\n" for r in rows
            )
        )
        settings = dict(samples=2, seq_len=256, shuffle=False)
        fetched = load_multimodal_calibration(served, twins(QWEN), **settings)
        read = load_multimodal_calibration(local, twins(QWEN), **settings)
        assert all((fetched.batches[0][k] == read.batches[0][k]).all() for k in read.batches[0])
    finally:
        server.shutdown()
        server.server_close()  # refuse at once, rather than accept and never answer
    unreachable = tmp_path / "unreachable.jsonl"
    unreachable.write_text(json.dumps({**rows[0], "image": base + rows[0]["image"]}) + "\n")
    with pytest.raises(DataError) as err:
        load_multimodal_calibration(unreachable, twins(QWEN), samples=1, seq_len=256)
    message = str(err.value)
    assert "row 0" in message and "URLs are read over the network" in message
    assert "\n" not in message and "does not exist" not in message


def test_text_column_caption_with_modality_text_calibrates_on_the_captions(
    twins, drawn_rows, tmp_path
):
    folder = twins(QWEN)
    parquet = tmp_path / "flickr.parquet"
    caption_lists(drawn_rows).to_parquet(str(parquet))
    request = CompressRequest(
        folder, parquet, None, modality="text", text_column="caption", samples=2, seq_len=8,
        pipeline="sequential", group_size=32,
    )  # fmt: skip
    assert request.calibration.text_column == "caption" and request.modality == "text"
    result = compress(request)
    assert result.layers and any("holds lists of texts" in n for n in result.data_notes)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    calibration = load_calibration(
        parquet, tokenizer, samples=2, seq_len=8, column="caption", shuffle=False
    )
    text = tokenizer.decode(calibration.batches[0]["input_ids"][0])
    assert read_rows(drawn_rows)[0]["text"].split()[0] in text and "[" not in text


def test_oversize_rows_are_dropped_and_counted_while_most_fit(twins, drawn_rows, tmp_path):
    """Rows of a large image among rows of small ones: at a seq_len below the large image's
    placeholder count, the small rows fit (losing text) and the large one is dropped and
    counted; at seq_len=8 no row fits, and the data is
    refused."""
    folder = twins(QWEN)
    full = load_multimodal_calibration(
        drawn_rows, folder, samples=6, seq_len=512, batch_size=1, shuffle=False
    )
    media = [int((b["input_ids"] == full.media_token_id).sum()) for b in full.batches]
    small = [i for i, m in enumerate(media) if m < max(media)]
    large = media.index(max(media))
    rows = read_rows(drawn_rows)
    mixed = tmp_path / "mixed.jsonl"
    order = [large, *small, *small]
    mixed.write_text(
        "".join(
            json.dumps({**rows[i], "image": str(drawn_rows.parent / rows[i]["image"])}) + "\n"
            for i in order
        )
    )
    seq_len = max(media) - 1  # the large image's placeholders alone no longer fit
    calibration = load_multimodal_calibration(
        mixed, folder, samples=len(order) - 1, seq_len=seq_len, shuffle=False
    )
    assert calibration.dropped == 1 and calibration.num_samples == len(order) - 1
    assert "1 rows dropped" in " ".join(calibration.notes)
    with pytest.raises(DataError, match="do not fit seq_len=8"):
        load_multimodal_calibration(mixed, folder, samples=3, seq_len=8, shuffle=False)


def test_evaluate_scores_all_of_a_short_text_and_says_how_much(refmodel_dir, drawn_rows, tmp_path):
    from transformers import AutoTokenizer

    captions = tmp_path / "captions.txt"
    captions.write_text("".join(row["text"] + "\n" for row in read_rows(drawn_rows)))
    tokenizer = AutoTokenizer.from_pretrained(refmodel_dir)
    stream = []
    for line in captions.read_text().splitlines():
        stream += tokenizer(line, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    windows = [stream[i : i + 16] for i in range(0, len(stream), 16)]
    assert len(windows) < 128
    result = evaluate_model(refmodel_dir, captions, seq_len=16, batch_size=4)
    assert result.num_tokens == sum(len(w) - 1 for w in windows)  # every window's first is context
    (note,) = result.notes
    assert (
        f"scored all the text: {len(windows)} windows" in note and f"{len(stream)} tokens" in note
    )
