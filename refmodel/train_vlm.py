"""Train llmc-trace's reference vision-language model: a small LLaVA that learned to caption
drawn images.

Why it exists: whether a compressor keeps what a vision-language model learned from images only
shows on a model that learned to read them. A random-weight twin answers the same whatever the
picture, so "GPTQ calibrated on images beats GPTQ calibrated on captions alone" means nothing
on it. This script trains a ``LlavaForConditionalGeneration`` (a CLIP vision tower, LLaVA's
two-layer projector, a Llama language model) on one CPU core in 10-15 minutes, to caption
scenes drawn here by ``llmc_trace.data.drawn``: two groups of one to three shapes, each group
of one colour and shape and in its own corner, and a caption that names them in reading order
("one red circle at the top left and three blue squares at the bottom right ."). Nothing in a
caption but its grammar follows from the text before it; count, colour, shape and corner come
from the picture. Two groups rather than one: with one, the language model only had to pass
along what the vision tower saw, and rounding its weights to 2 bits cost nothing measurable;
naming two groups in order makes it bind each group's words to its place, and that is what
compression can damage. It writes into ``vlm/``:It writes into ``vlm/``:

* ``config.json``, ``generation_config.json``, ``model.safetensors`` (bf16 weights);
* the processor's files: a word-level tokenizer over the captions' words
  (``tokenizer.json``, ``tokenizer_config.json``), ``chat_template.jinja``,
  ``preprocessor_config.json`` (a CLIP image processor) and ``processor_config.json``
  (``LlavaProcessor``'s own arguments), so that ``AutoProcessor.from_pretrained`` opens the
  folder offline, without torchvision;
* ``calib/`` and ``eval/``: 128 captioned PNGs each, with ``captions.jsonl``, drawn with seeds
  of their own (the rows compress and evaluate read);
* ``results.json``: recipe, sizes, versions, timings, training history, and the perplexity of
  the evaluation captions given their images, given a blank image instead, and the least any
  model that does not see the image can expect.

Why LLaVA and not Qwen2-VL, which vLLM serves too: in transformers 5 ``Qwen2VLProcessor``
(and Qwen2.5-VL's) always loads a video processor, every video processor class requires
torchvision, and no CPU build of torchvision exists here, so ``AutoProcessor`` cannot open a
Qwen2-VL folder on this machine whatever its files say. ``LlavaProcessor`` holds only a
tokenizer and an image processor, and the CLIP image processor has a Pillow backend.

Training draws fresh scenes every step (``draw_captioned_scene(..., varied=True)``: size,
offset and colour vary, so no caption fixes its image); the calibration and evaluation scenes
come from other seeds, and ``results.json`` counts how many of them training ever drew (none).
Every choice is seeded, so a rerun gives the same files up to CPU float reduction order.

The perplexity here is self-contained (torch, transformers and the processor): the tests check
llmc-trace's ``evaluate_multimodal`` against these figures, so they must not come from it. It
follows the same conventions: rows in file order in batches of 8, right-padded; every text
token after the first is scored except image placeholders and padding.

    python refmodel/train_vlm.py                  # 10-15 min, writes into refmodel/vlm/
    python refmodel/train_vlm.py --out DIR        # elsewhere
    python refmodel/train_vlm.py --steps 50       # a quick look at the speed (writes to --out)
    python refmodel/train_vlm.py --evaluate-only  # recompute results.json's measured part
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedTokenizerFast,
    ProcessorMixin,
)

from llmc_trace.data.drawn import (
    CAPTION_WORDS,
    COLOURS,
    CORNERS,
    COUNTS,
    SHAPES,
    draw_captioned_scene,
    write_drawn_dataset,
)
from refmodel import VLM_FOLDER
from refmodel.train import (
    Recipe,
    learning_rate,
    optimizer_for,
    portable_tokenizer_config,
    versions,
    write_json,
)

SEED = 1234  # initial weights
TRAIN_SEED = SEED + 1  # the training images
CALIB_SEED = SEED + 2
EVAL_SEED = SEED + 3
IMAGE_SIZE = 96
PATCH_SIZE = 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the class token is dropped ("default")
GROUPS = 2  # groups of shapes in an image, each in its own corner
SPLIT_ROWS = 128  # rows of calib/ and of eval/
VAL_ROWS = 32  # eval rows scored during training
EVAL_BATCH_SIZE = 8  # evaluate_multimodal's default

#: Ids 0-4: unknown, bos, eos, pad and the image placeholder the processor repeats.
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<image>")
UNK, BOS, EOS, PAD, IMAGE = SPECIAL_TOKENS
IMAGE_TOKEN_ID = SPECIAL_TOKENS.index(IMAGE)
#: What the chat layout adds to the captions' words (roles as LLaVA-1.5 writes them).
LAYOUT_WORDS = ("USER", "ASSISTANT", ":")
VOCAB_SIZE = 64
#: One training or evaluation row, as the chat template lays out a user turn holding the
#: image and an assistant turn holding the caption (checked when the processor is written).
PROMPT = "USER: " + IMAGE + "\n ASSISTANT: {caption}" + EOS
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'].upper() + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '" + IMAGE + "\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '" + EOS + "' }}{% else %}{{ ' ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT: ' }}{% endif %}"
)
#: Pixel normalisation: white becomes 0 (and black -2), so a patch of background embeds as its
#: position alone and the few patches a shape touches stand out from the first step. With
#: CLIP's mean and std (tuned for photographs) the white background dominated every patch's
#: embedding: for 2,000 steps the loss stayed at the bound of a model that ignores the image
#: while training shrank the tower's output to a constant.
IMAGE_MEAN = [1.0, 1.0, 1.0]
IMAGE_STD = [0.5, 0.5, 0.5]
#: ``preprocessor_config.json``: CLIP's image processor at this tower's size, named as the
#: published LLaVA checkpoints name it (transformers 5 falls back to its Pillow backend).
PREPROCESSOR = {
    "image_processor_type": "CLIPImageProcessor",
    "processor_class": "LlavaProcessor",
    "do_resize": True,
    "size": {"shortest_edge": IMAGE_SIZE},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": IMAGE_MEAN,
    "image_std": IMAGE_STD,
    "do_convert_rgb": True,
}
#: ``processor_config.json``: how many placeholders one image becomes (patches, less the class
#: token that the "default" strategy drops).
PROCESSOR = {
    "processor_class": "LlavaProcessor",
    "image_token": IMAGE,
    "patch_size": PATCH_SIZE,
    "vision_feature_select_strategy": "default",
    "num_additional_image_tokens": 1,
}
#: What training does; every field is recorded in results.json.
RECIPE = Recipe(
    steps=5000,
    batch_size=32,
    peak_lr=2e-3,
    warmup_steps=100,
    final_lr_fraction=0.05,
    log_every=50,
    validate_every=500,
    # the matrices are tiny: a second thread adds synchronisation, not speed, and on the shared
    # 2-core machine it made a step ten times slower
    threads=1,
)
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "results.json",
)
OUTPUT_FOLDERS = ("calib", "eval")

#: A row: an image and its caption.
Row = tuple[Image.Image, str]


# ---------------------------------------------------------------------------------------------
# Model and processor


def vlm_config() -> LlavaConfig:
    """LLaVA-1.5's layout at a size that trains on a CPU and fits the repository.

    The language model is a 2-layer Llama of width 128 (4 query heads, 2 key/value heads of 32)
    and SwiGLU width 256: every Linear it has takes an input 128 or 256 wide, so 4-bit GPTQ in
    groups of 128 applies to all of them. The vision tower is a 2-layer CLIP of width 64 on
    96-pixel images in 16-pixel patches (36 image tokens); its last layer feeds the projector
    (``vision_feature_layer=-1``: with two layers LLaVA-1.5's -2 would leave one unused).
    Tower and projector stay in full precision under compression, as llm-compressor's recipes
    keep them.
    """
    vision = CLIPVisionConfig(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=64,
    )
    text = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        pad_token_id=SPECIAL_TOKENS.index(PAD),
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=IMAGE_TOKEN_ID,
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def vocabulary() -> dict[str, int]:
    """Special tokens, the chat layout's words and every word a drawn caption can hold, then
    unused fillers up to ``VOCAB_SIZE`` (so the tokenizer's size is the model's)."""
    words = list(dict.fromkeys([*SPECIAL_TOKENS, *LAYOUT_WORDS, *CAPTION_WORDS]))
    words += [f"<unused_{index}>" for index in range(len(words), VOCAB_SIZE)]
    return {word: index for index, word in enumerate(words)}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer that splits on spaces and punctuation and puts bos first, as
    LLaVA-1.5's Llama tokenizer does; an unknown word becomes ``<unk>``."""
    model = Tokenizer(models.WordLevel(vocabulary(), unk_token=UNK))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.add_special_tokens(list(SPECIAL_TOKENS))
    model.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, SPECIAL_TOKENS.index(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=model,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        extra_special_tokens={"image_token": IMAGE},
        padding_side="right",
    )


def write_processor(folder: Path) -> ProcessorMixin:
    """Write the processor's files as the published LLaVA checkpoints lay them out, and return
    the processor ``AutoProcessor`` reads back from them (the one training uses, so that what
    is saved is what the model learned with)."""
    build_tokenizer().save_pretrained(folder)
    portable_tokenizer_config(folder / "tokenizer_config.json")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    write_json(folder / "preprocessor_config.json", PREPROCESSOR)
    write_json(folder / "processor_config.json", PROCESSOR)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    conversation = [
        {"role": "user", "content": [{"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "one red circle ."}]},
    ]
    laid_out = processor.apply_chat_template(conversation, tokenize=False)
    assert laid_out == PROMPT.format(caption="one red circle ."), laid_out
    return processor


def encode(processor: ProcessorMixin, rows: list[Row]) -> dict[str, torch.Tensor]:
    """Rows laid out as ``PROMPT`` and preprocessed together, right-padded to the longest."""
    return processor(
        text=[PROMPT.format(caption=caption) for _, caption in rows],
        images=[image for image, _ in rows],
        padding=True,
        padding_side="right",
        return_tensors="pt",
    ).data


def scored_targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Which of positions 1..T-1 are scored, (B, T-1): real text, not an image placeholder and
    not padding (right padding, so a real target always follows a real position)."""
    targets = batch["input_ids"][:, 1:]
    return batch["attention_mask"][:, 1:].bool() & (targets != IMAGE_TOKEN_ID)


# ---------------------------------------------------------------------------------------------
# Data


def image_digest(image: Image.Image) -> bytes:
    """The pixels' digest: training keeps those of every image it draws, so that the splits'
    images can be checked against them."""
    return hashlib.sha256(image.tobytes()).digest()


def draw_rows(rng: np.random.Generator, count: int) -> list[Row]:
    """``count`` varied drawn scenes of ``IMAGE_SIZE`` pixels square, with their captions."""
    size = (IMAGE_SIZE, IMAGE_SIZE)
    return [draw_captioned_scene(rng, size, GROUPS, varied=True) for _ in range(count)]


def write_split(folder: Path, seed: int) -> Path:
    """``SPLIT_ROWS`` drawn rows as ``captions.jsonl`` and PNGs, the layout compress reads."""
    size = (IMAGE_SIZE, IMAGE_SIZE)
    return write_drawn_dataset(
        folder, SPLIT_ROWS, seed=seed, sizes=(size,), varied=True, groups=GROUPS
    )


def read_split(folder: Path) -> list[Row]:
    """The rows of ``folder/captions.jsonl`` in file order, images read as RGB."""
    rows = []
    for line in (folder / "captions.jsonl").read_text().splitlines():
        row = json.loads(line)
        with Image.open(folder / row["image"]) as image:
            rows.append((image.convert("RGB"), row["text"]))
    return rows


# ---------------------------------------------------------------------------------------------
# Training and measurement


def train(
    model: LlavaForConditionalGeneration,
    processor: ProcessorMixin,
    held_out: list[Row],
    recipe: Recipe,
    drawn: set[bytes],
) -> list[dict[str, float]]:
    """Captioning on fresh drawn images: next-token cross-entropy on every text token but the
    image placeholders; returns the logged history and adds each training image's digest to
    ``drawn``."""
    optimizer = optimizer_for(model, recipe)
    rng = np.random.default_rng(TRAIN_SEED)
    history: list[dict[str, float]] = []
    smoothed = None
    started = time.perf_counter()
    model.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe)
        rows = draw_rows(rng, recipe.batch_size)
        drawn.update(image_digest(image) for image, _ in rows)
        batch = encode(processor, rows)
        labels = batch["input_ids"].clone()
        labels[:, 1:][~scored_targets(batch)] = -100
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_norm)
        optimizer.step()
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        last = step == recipe.steps - 1
        if (step + 1) % recipe.log_every == 0 or last:
            row: dict[str, float] = {
                "step": step + 1,
                "images": (step + 1) * recipe.batch_size,
                "train_loss_ema": round(smoothed, 4),
                "lr": learning_rate(step, recipe),
                "seconds": round(time.perf_counter() - started, 1),
            }
            if (step + 1) % recipe.validate_every == 0 or last:
                model.eval()
                row["val_ppl"] = round(perplexity(model, processor, held_out[:VAL_ROWS])[0], 4)
                model.train()
            history.append(row)
            print(
                f"step {step + 1}/{recipe.steps}  loss {smoothed:.4f}  {row['seconds']:.0f} s"
                + (f"  val ppl {row['val_ppl']:.4f}" if "val_ppl" in row else ""),
                flush=True,
            )
    model.eval()
    return history


def perplexity(
    model: LlavaForConditionalGeneration,
    processor: ProcessorMixin,
    rows: list[Row],
    batch_size: int = EVAL_BATCH_SIZE,
) -> tuple[float, int]:
    """exp(mean NLL) of each row's scored text tokens given the image and the tokens before
    them (``scored_targets``), rows in order in batches; and how many tokens were scored."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = encode(processor, rows[start : start + batch_size])
            logits = model(**batch).logits.float()[:, :-1]
            log_probs = torch.log_softmax(logits, dim=-1)
            targets = log_probs.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
            scored = scored_targets(batch)
            total -= targets[scored].double().sum().item()
            count += int(scored.sum())
    return math.exp(total / count), count


def greedy_captions(
    model: LlavaForConditionalGeneration,
    processor: ProcessorMixin,
    images: list[Image.Image],
    batch_size: int = EVAL_BATCH_SIZE,
) -> list[str]:
    """What the model writes for each image after ``PROMPT``'s assistant opening, greedily,
    until eos (every prompt is as long as the next, so no padding)."""
    opening = PROMPT.split("{caption}")[0]
    written = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            chunk = images[start : start + batch_size]
            batch = processor(text=[opening] * len(chunk), images=chunk, return_tensors="pt")
            output = model.generate(**batch, max_new_tokens=16, do_sample=False)
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            written += processor.batch_decode(new_tokens, skip_special_tokens=True)
    return written


def blank(rows: list[Row]) -> list[Row]:
    """The same captions with a white image of the same size: the picture's information gone,
    the layout (and the number of placeholders) unchanged."""
    return [(Image.new("RGB", image.size, (255, 255, 255)), caption) for image, caption in rows]


#: The captions a scene can have, all equally likely: which ``GROUPS`` corners hold a group,
#: and each group's count, colour and shape, drawn independently.
CAPTION_CHOICES = (
    math.comb(len(CORNERS), GROUPS) * (len(COUNTS) * len(COLOURS) * len(SHAPES)) ** GROUPS
)


def image_free_bound(rows: int, scored_tokens: int) -> float:
    """The least perplexity a model that does not see the image can expect on these rows.

    A caption is one of ``CAPTION_CHOICES`` equally likely ones, so it costs such a model at
    least ln(CAPTION_CHOICES) nats in expectation; everything else in a row (the layout,
    "at the", the plural's "s", "and", the full stop, eos) follows from those choices and can
    cost nothing.
    """
    return math.exp(rows * math.log(CAPTION_CHOICES) / scored_tokens)


def load(folder: Path) -> LlavaForConditionalGeneration:
    """The saved model in float32 (transformers' default attention), as the figures compute it."""
    return LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def split_figures(model, processor, rows: list[Row]) -> dict[str, float | int]:
    """Perplexity of one split's captions given their images and given blank images."""
    with_images, scored = perplexity(model, processor, rows)
    blank_images, _ = perplexity(model, processor, blank(rows))
    written = greedy_captions(model, processor, [image for image, _ in rows])
    return {
        "rows": len(rows),
        "scored_tokens": scored,
        "ppl_with_images": with_images,
        "ppl_blank_images": blank_images,
        "ppl_image_free_bound": image_free_bound(len(rows), scored),
        "greedy_captions_exact": sum(w == c for w, (_, c) in zip(written, rows)),
    }


def measure(folder: Path) -> dict[str, Any]:
    """results.json's measured part, from the saved weights, processor and splits."""
    model = load(folder)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    results = {}
    for split in OUTPUT_FOLDERS:
        results[split] = split_figures(model, processor, read_split(folder / split))
        figures = results[split]
        print(
            f"{split}: ppl {figures['ppl_with_images']:.4f} with images, "
            f"{figures['ppl_blank_images']:.4f} with blank images, "
            f"{figures['ppl_image_free_bound']:.4f} at best without them "
            f"({figures['scored_tokens']} tokens); greedy captions exact "
            f"{figures['greedy_captions_exact']} of {figures['rows']}",
            flush=True,
        )
    return {"results": results}


def parameter_counts(model: LlavaForConditionalGeneration) -> dict[str, int]:
    parts = {
        "vision_tower": model.model.vision_tower,
        "multi_modal_projector": model.model.multi_modal_projector,
        "language_model": model.model.language_model,
        "lm_head": model.lm_head,
    }
    counts = {name: sum(p.numel() for p in part.parameters()) for name, part in parts.items()}
    return {**counts, "total": sum(p.numel() for p in model.parameters())}


# ---------------------------------------------------------------------------------------------
# The run


def run(out: Path, recipe: Recipe) -> None:
    torch.set_num_threads(recipe.threads)
    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".train-", dir=out))
    try:
        processor = write_processor(staging)
        for split, seed in (("calib", CALIB_SEED), ("eval", EVAL_SEED)):
            write_split(staging / split, seed)
        held_out = read_split(staging / "eval")

        torch.manual_seed(SEED)
        model = LlavaForConditionalGeneration(vlm_config())
        drawn: set[bytes] = set()
        cpu_began = time.process_time()
        history = train(model, processor, held_out, recipe, drawn)
        train_seconds = history[-1]["seconds"]
        train_cpu_seconds = round(time.process_time() - cpu_began, 1)

        model.to(torch.bfloat16).save_pretrained(staging)
        seen = {
            split: sum(image_digest(image) in drawn for image, _ in read_split(staging / split))
            for split in OUTPUT_FOLDERS
        }
        measured = measure(staging)
        write_json(
            staging / "results.json",
            {
                "architecture": "LlavaForConditionalGeneration",
                "recipe": asdict(recipe),
                "seeds": {
                    "weights": SEED,
                    "train": TRAIN_SEED,
                    "calib": CALIB_SEED,
                    "eval": EVAL_SEED,
                },
                "parameters": parameter_counts(model),
                "image": {"size": IMAGE_SIZE, "patch": PATCH_SIZE, "tokens": IMAGE_TOKENS},
                "images": {
                    "train_drawn": recipe.steps * recipe.batch_size,
                    "train_distinct": len(drawn),
                    **{f"{split}_seen_in_training": count for split, count in seen.items()},
                },
                "seconds": {
                    "training": train_seconds,
                    # on a shared machine wall time says little; CPU time / threads is the
                    # uncontended wall
                    "training_cpu": train_cpu_seconds,
                    "total": round(time.perf_counter() - began, 1),
                },
                "versions": {**versions(), "pillow": Image.__version__},
                "history": history,
                **measured,
            },
        )
        for name in OUTPUT_FILES:
            (staging / name).chmod(0o644)  # some writers create private files; these are shared
            os.replace(staging / name, out / name)
        for name in OUTPUT_FOLDERS:
            shutil.rmtree(out / name, ignore_errors=True)
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def evaluate_only(folder: Path) -> None:
    """Recompute results.json's measured part from the saved weights and splits."""
    results_path = folder / "results.json"
    record = json.loads(results_path.read_text())
    record |= measure(folder)
    staged = results_path.with_suffix(".json.tmp")
    write_json(staged, record)
    os.replace(staged, results_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=VLM_FOLDER, help="folder to write (default: vlm/)"
    )
    parser.add_argument("--steps", type=int, default=RECIPE.steps)
    parser.add_argument("--threads", type=int, default=RECIPE.threads)
    parser.add_argument("--evaluate-only", action="store_true")
    args = parser.parse_args(argv)
    if args.evaluate_only:
        evaluate_only(args.out)
        return 0
    recipe = Recipe(**{**asdict(RECIPE), "steps": args.steps, "threads": args.threads})
    run(args.out, recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
