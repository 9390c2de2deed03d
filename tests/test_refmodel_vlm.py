"""The reference vision-language model the repository carries, and what its script measured.

The references: the training script's own perplexity (``refmodel/train_vlm.py``, plain torch
over the processor's output, recorded in ``results.json``), the captions the images were drawn
with, and the drawing's own distribution of captions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from llmc_trace.data.drawn import draw_captioned_scene
from llmc_trace.data.processor import load_processor
from llmc_trace.evaluate.run import evaluate_multimodal
from refmodel import VLM_FOLDER
from refmodel.train_vlm import (
    CAPTION_CHOICES,
    GROUPS,
    IMAGE_TOKEN_ID,
    IMAGE_TOKENS,
    PROMPT,
    blank,
    greedy_captions,
    perplexity,
    read_split,
)
from tests.conftest import require_refmodel

FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "results.json",
    "calib/captions.jsonl",
    "eval/captions.jsonl",
)
#: The folder's committed size limit: the repository travels to GPU machines under 64 MiB.
SIZE_LIMIT = 1_500_000


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run on one thread: the model's matrices are tiny, and on a busy 2-core machine a second
    thread only waits (this module took 28 s so, 3 s on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vlm_dir() -> Path:
    return require_refmodel(VLM_FOLDER, FILES)


@pytest.fixture(scope="module")
def record(vlm_dir: Path) -> dict:
    return json.loads((vlm_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def recorded(record: dict) -> dict:
    return record["results"]


@pytest.fixture(scope="module")
def model(vlm_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForImageTextToText

    loaded = AutoModelForImageTextToText.from_pretrained(
        vlm_dir, dtype=torch.float32, local_files_only=True
    )
    return loaded.eval()


@pytest.fixture(scope="module")
def processor(vlm_dir: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(vlm_dir, local_files_only=True)


def test_the_folder_is_small_bf16_and_every_language_linear_takes_groups_of_128(
    vlm_dir: Path, model: torch.nn.Module
) -> None:
    files = [path for path in vlm_dir.rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in files) < SIZE_LIMIT
    config = json.loads((vlm_dir / "config.json").read_text())
    assert config["model_type"] == "llava" and config["dtype"] == "bfloat16"
    assert config["text_config"]["model_type"] == "llama"
    assert config["vision_config"]["model_type"] == "clip_vision_model"
    with safe_open(vlm_dir / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(key).get_dtype() for key in weights.keys()} == {"BF16"}
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    language = model.model.language_model
    linears = [m for m in language.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * language.config.num_hidden_layers
    assert all(linear.in_features % 128 == 0 for linear in linears)


def test_auto_processor_and_our_loader_open_it_offline(vlm_dir: Path, processor) -> None:
    """``AutoProcessor`` itself (no parts assembled by ``load_processor``), and one row laid
    out by the chat template becomes bos, the layout, one placeholder per image token and the
    caption's words."""
    assert type(processor).__name__ == "LlavaProcessor"
    loaded = load_processor(vlm_dir, "image")
    assert loaded.built_from == "AutoProcessor" and loaded.placeholder_ids == {"image": 4}
    image, caption = read_split(vlm_dir / "eval")[0]
    conversation = [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": caption}]},
    ]
    text = processor.apply_chat_template(conversation, tokenize=False)
    assert text == PROMPT.format(caption=caption)
    ids = processor(text=[text], images=[image], return_tensors="pt")["input_ids"][0].tolist()
    tokens = processor.tokenizer.convert_ids_to_tokens(ids)
    layout = ["<s>", "USER", ":", *["<image>"] * IMAGE_TOKENS, "ASSISTANT", ":"]
    assert tokens == [*layout, *caption.split(), "</s>"]
    assert ids.count(IMAGE_TOKEN_ID) == IMAGE_TOKENS


def test_the_model_captions_unseen_images(model, processor, vlm_dir: Path, record) -> None:
    """Greedy captions of evaluation images, none of which training drew, are the captions
    they were drawn with."""
    assert record["images"]["eval_seen_in_training"] == 0
    rows = read_split(vlm_dir / "eval")[:16]
    written = greedy_captions(model, processor, [image for image, _ in rows])
    exact = sum(w == caption for w, (_, caption) in zip(written, rows))
    assert exact >= 14, list(zip(written, [caption for _, caption in rows]))


@pytest.fixture(scope="module")
def blank_split(vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The evaluation captions with a white image each, in the same layout on disk."""
    folder = tmp_path_factory.mktemp("blank")
    (folder / "images").mkdir()
    lines = (vlm_dir / "eval" / "captions.jsonl").read_text().splitlines()
    for line in lines:
        row = json.loads(line)
        with Image.open(vlm_dir / "eval" / row["image"]) as image:
            Image.new("RGB", image.size, (255, 255, 255)).save(folder / row["image"])
    (folder / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_our_evaluator_gives_the_training_scripts_figures(
    vlm_dir: Path, recorded, blank_split: Path
) -> None:
    """``evaluate_multimodal`` on ``eval/`` (and on its blank-image copy) against the figures
    ``train_vlm.py`` recorded, computed by its own code on the same rows and batches."""
    figures = recorded["eval"]
    for data, key in ((vlm_dir / "eval", "ppl_with_images"), (blank_split, "ppl_blank_images")):
        ours = evaluate_multimodal(
            vlm_dir, data / "captions.jsonl", samples=figures["rows"], dtype=torch.float32
        )
        assert ours.perplexity == pytest.approx(figures[key], rel=1e-5), key
        assert ours.num_tokens == figures["scored_tokens"]


def row_nlls(model, processor, rows) -> np.ndarray:
    """Each row's summed negative log-likelihood, by the training script's perplexity."""
    sums = []
    for row in rows:
        ppl, tokens = perplexity(model, processor, [row])
        sums.append(tokens * math.log(ppl))
    return np.array(sums)


def standard_errors(differences: np.ndarray) -> float:
    """How many standard errors the mean of paired per-row differences is from zero."""
    return differences.mean() / (differences.std(ddof=1) / math.sqrt(len(differences)))


def test_the_image_is_what_the_captions_perplexity_rests_on(
    model, processor, vlm_dir: Path
) -> None:
    """With its image a caption costs far less than with a blank image, and far less than any
    model that does not see the image can expect (ln ``CAPTION_CHOICES`` a row, as
    ``image_free_bound`` takes it): both gaps are many standard errors of the rows' paired
    differences, not a draw of the rows."""
    rows = read_split(vlm_dir / "eval")
    with_images = row_nlls(model, processor, rows)
    blank_images = row_nlls(model, processor, blank(rows))
    assert standard_errors(blank_images - with_images) > 10
    assert standard_errors(math.log(CAPTION_CHOICES) - with_images) > 10


def miller_madow_entropy(outcomes: list) -> float:
    """The entropy of ``outcomes``' distribution in nats, with Miller-Madow's correction of the
    plug-in estimate's bias for mass not yet seen."""
    _, counts = np.unique(np.array(outcomes, dtype=object).astype(str), return_counts=True)
    shares = counts / len(outcomes)
    return float(-(shares * np.log(shares)).sum()) + (len(counts) - 1) / (2 * len(outcomes))


def test_the_bound_rests_on_how_scenes_are_drawn() -> None:
    """``image_free_bound`` takes a caption's parts as uniform and independent: which corners
    hold the groups (the pairs of ``CORNERS``) and each group's count, colour and shape. Over
    6,000 drawn captions each part takes every value it can, and the parts' entropies add up to
    ln ``CAPTION_CHOICES``."""
    rng = np.random.default_rng(0)
    corners, first, second = [], [], []
    for _ in range(6000):
        caption = draw_captioned_scene(rng, (28, 28), GROUPS)[1]
        groups = [group.split() for group in caption.removesuffix(" .").split(" and ")]
        corners.append(" / ".join(" ".join(words[5:]) for words in groups))
        first.append(" ".join(groups[0][:3]))
        second.append(" ".join(groups[1][:3]))
    parts = (corners, first, second)
    assert [len(set(part)) for part in parts] == [6, 54, 54]
    entropy = sum(miller_madow_entropy(part) for part in parts)
    assert CAPTION_CHOICES == 6 * 54 * 54
    assert entropy == pytest.approx(math.log(CAPTION_CHOICES), abs=0.02)
