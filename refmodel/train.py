"""Train llmc-trace's reference model: a small Llama that learned Python from the standard library.

Why it exists: a compressor's quality only shows on weights that learned something. Random
weights have no structure for GPTQ's error feedback or SparseGPT's reconstruction to exploit, so
"GPTQ beats round-to-nearest" means nothing on them. This script trains a small
``LlamaForCausalLM`` from data every machine with Python already has (the ``.py`` files of the
interpreter's own standard library), on a 2-core CPU in about half an hour, and writes beside
itself everything the tests, the benchmarks and the README read:

* ``config.json``, ``generation_config.json``, ``model.safetensors`` (bf16 weights);
* a byte-level BPE tokenizer trained on the training files only (``tokenizer.json`` and its
  ``tokenizer_config.json``), so ``AutoTokenizer.from_pretrained`` opens it offline;
* ``calib.npy`` (random windows of the training stream) and ``eval.npy`` (non-overlapping
  windows of the held-out files), int32 token arrays of 512 columns;
* ``split.json`` (which file went where, and what was left out and why) and ``results.json``
  (arguments, versions, training history, timings and the perplexity table the README quotes).

Every choice is seeded or sorted (file order, split, windows, initial weights, batch order), so a
rerun on the same Python (its standard library is the data) gives the same files up to CPU float
reduction order. Outputs are written into a temporary folder and moved into place only when
everything is complete.

The perplexity and round-to-nearest code here is deliberately self-contained (torch and
transformers only): the tests compare llmc-trace's own perplexity with these figures, so they must
not come from llmc-trace.

    python refmodel/train.py                     # about 35 min on 2 cores, writes into refmodel/
    python refmodel/train.py --out DIR           # elsewhere
    python refmodel/train.py --steps 20          # a quick look at the speed (writes to --out)
    python refmodel/train.py --evaluate-only     # recompute results.json's table from the weights
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

HERE = Path(__file__).resolve().parent
SEED = 1234
SEQ_LEN = 512
EOT = "<|endoftext|>"  # id 0: separates files, and serves as bos, eos, pad and unk
VOCAB_SIZE = 8192
EVAL_FRACTION = 0.05
CALIB_ROWS = 256
EVAL_ROWS = 128
VAL_ROWS = 16  # eval rows scored during training
OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "calib.npy",
    "eval.npy",
    "split.json",
    "results.json",
)


@dataclass
class Recipe:
    """What training does; every field is recorded in results.json."""

    steps: int = 1450
    batch_size: int = 4
    peak_lr: float = 1.5e-3
    warmup_steps: int = 50
    final_lr_fraction: float = 0.02
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    threads: int = 2
    log_every: int = 50
    validate_every: int = 250


@dataclass
class Corpus:
    """The standard library's source files, split by file into training and held-out text."""

    train: dict[str, str]
    held_out: dict[str, str]
    skipped: dict[str, list[str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Data


#: Folders never read: third-party packages, generated documentation, the build configuration.
SKIPPED_FOLDERS = ("site-packages", "pydoc_data", "__pycache__")


def source_files(stdlib: Path) -> list[Path]:
    """Every ``.py`` file under ``stdlib`` in sorted relative-path order, the folders that hold
    no human-written library code (``SKIPPED_FOLDERS``, ``config-*``) not walked."""
    found = []
    for folder, subfolders, names in os.walk(stdlib):
        subfolders[:] = [
            name
            for name in subfolders
            if name not in SKIPPED_FOLDERS and not name.startswith("config-")
        ]
        found.extend(Path(folder) / name for name in names if name.endswith(".py"))
    return sorted(found, key=lambda path: path.relative_to(stdlib).as_posix())


def why_left_out(relative: Path, raw: bytes, seen: set[str]) -> str | None:
    """Why a file does not belong in the corpus (None when it does); records its digest."""
    if relative.name.startswith("_sysconfigdata_"):
        return "generated build variables"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    if not text.strip():
        return "empty"
    if relative.parts[0] == "encodings" and "gencodec.py" in text:
        return "charmap table generated by gencodec.py"
    digest = hashlib.sha256(raw).hexdigest()
    if digest in seen:
        return "exact duplicate of an earlier file"
    seen.add(digest)
    return None


def collect_corpus(stdlib: Path, seed: int) -> Corpus:
    """Read the kept ``.py`` files under ``stdlib`` and split them 95/5 at random, by file.

    Left out: generated build variables, charmap codecs written by ``gencodec.py`` (lookup
    tables), files that are not UTF-8 (deliberately mis-encoded test inputs), empty files and
    exact duplicates (the first in path order is kept).
    """
    skipped: dict[str, list[str]] = {}
    seen: set[str] = set()
    texts: dict[str, str] = {}
    for path in source_files(stdlib):
        relative = path.relative_to(stdlib)
        raw = path.read_bytes()
        reason = why_left_out(relative, raw, seen)
        if reason is None:
            texts[relative.as_posix()] = raw.decode("utf-8")
        else:
            skipped.setdefault(reason, []).append(relative.as_posix())
    names = sorted(texts)
    random.Random(seed).shuffle(names)
    held_out_count = round(EVAL_FRACTION * len(names))
    held_out = {name: texts[name] for name in sorted(names[:held_out_count])}
    train = {name: texts[name] for name in sorted(names[held_out_count:])}
    return Corpus(train, held_out, skipped)


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """A byte-level BPE of ``VOCAB_SIZE`` tokens: every byte encodes, so no token is unknown."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> np.ndarray:
    """The texts encoded one after another, each followed by the end-of-text token (id 0)."""
    eot = tokenizer.token_to_id(EOT)
    pieces = []
    for encoding in tokenizer.encode_batch(texts):
        pieces.append(np.asarray(encoding.ids + [eot], dtype=np.int32))
    return np.concatenate(pieces)


def calibration_windows(stream: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """``rows`` windows of the training stream at uniform random offsets (overlaps allowed)."""
    starts = np.random.default_rng(seed).integers(0, len(stream) - SEQ_LEN + 1, size=rows)
    return np.stack([stream[s : s + SEQ_LEN] for s in starts]).astype(np.int32)


def evaluation_windows(stream: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """``rows`` of the held-out stream's non-overlapping windows, chosen at random, in order."""
    windows = stream[: len(stream) // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN)
    chosen = np.sort(np.random.default_rng(seed).choice(len(windows), size=rows, replace=False))
    return windows[chosen].astype(np.int32)


# ---------------------------------------------------------------------------------------------
# Model, training and measurement


def model_config() -> LlamaConfig:
    """A 6-layer Llama with grouped-query attention whose every Linear input is a multiple of
    128 wide, so group sizes 32, 64 and 128 apply to every layer."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )


def learning_rate(step: int, recipe: Recipe) -> float:
    """Linear warm-up, then cosine decay to ``final_lr_fraction`` of the peak at the last step."""
    if step < recipe.warmup_steps:
        return recipe.peak_lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - 1 - recipe.warmup_steps)
    floor = recipe.final_lr_fraction
    return recipe.peak_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_for(model, recipe: Recipe):
    """AdamW with weight decay on every matrix (embeddings and head too), none on norms."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": recipe.weight_decay},
            {"params": vectors, "weight_decay": 0.0},
        ],
        lr=recipe.peak_lr,
        betas=recipe.betas,
        eps=1e-8,
    )


def perplexity(model, rows: np.ndarray, batch_size: int = 8) -> float:
    """exp(mean NLL) of each row's tokens 1..T-1 given the tokens before them, rows independent."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            ids = torch.as_tensor(rows[start : start + batch_size], dtype=torch.long)
            logits = model(input_ids=ids).logits.float()[:, :-1]
            log_probs = torch.log_softmax(logits, dim=-1)
            total -= log_probs.gather(-1, ids[:, 1:, None]).sum().item()
            count += ids[:, 1:].numel()
    return math.exp(total / count)


def train(model, stream: np.ndarray, held_out: np.ndarray, recipe: Recipe, seed: int) -> list:
    """Next-token training on random windows of the stream; returns the logged history."""
    optimizer = optimizer_for(model, recipe)
    offsets = np.random.default_rng(seed)
    history: list[dict[str, float]] = []
    smoothed = None
    started = time.perf_counter()
    model.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe)
        starts = offsets.integers(0, len(stream) - SEQ_LEN + 1, size=recipe.batch_size)
        batch = torch.as_tensor(
            np.stack([stream[s : s + SEQ_LEN] for s in starts]), dtype=torch.long
        )
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_norm)
        optimizer.step()
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        last = step == recipe.steps - 1
        if (step + 1) % recipe.log_every == 0 or last:
            elapsed = time.perf_counter() - started
            row = {
                "step": step + 1,
                "tokens": (step + 1) * recipe.batch_size * SEQ_LEN,
                "train_loss_ema": round(smoothed, 4),
                "lr": learning_rate(step, recipe),
                "seconds": round(elapsed, 1),
            }
            if (step + 1) % recipe.validate_every == 0 or last:
                model.eval()
                row["val_ppl"] = round(perplexity(model, held_out[:VAL_ROWS]), 3)
                model.train()
            history.append(row)
            rate = row["tokens"] / elapsed
            print(
                f"step {step + 1}/{recipe.steps}  loss {smoothed:.3f}  {rate:.0f} tokens/s"
                + (f"  val ppl {row['val_ppl']:.1f}" if "val_ppl" in row else ""),
                flush=True,
            )
    model.eval()
    return history


def round_to_nearest_(model, bits: int, group_size: int | None) -> int:
    """Fake-quantize every decoder Linear in place: symmetric, ``max|w| / (2^(b-1) - 1)`` per
    group of ``group_size`` input columns (a whole row when None). Returns the layer count."""
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
                continue
            weight = module.weight.float()
            rows, columns = weight.shape
            width = group_size or columns
            groups = weight.reshape(rows, columns // width, width)
            top = 2 ** (bits - 1) - 1
            scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / top
            quantized = torch.clamp(torch.round(groups / scale), -top - 1, top) * scale
            module.weight.copy_(quantized.reshape(rows, columns))
            count += 1
    return count


QUANTIZED_ROWS = (
    ("RTN W4 per channel", 4, None),
    ("RTN W4 group 128", 4, 128),
    ("RTN W3 group 128", 3, 128),
    ("RTN W2 group 64", 2, 64),
)


def measure(folder: Path, calib: np.ndarray, held_out: np.ndarray) -> list[dict]:
    """Perplexity of the saved bf16 weights computed in float32, and of round-to-nearest."""

    def load():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    rows = []
    for label, bits, group_size in (("bf16 weights, fp32 compute", None, None), *QUANTIZED_ROWS):
        model = load()
        layers = round_to_nearest_(model, bits, group_size) if bits else 0
        rows.append(
            {
                "config": label,
                "bits": bits,
                "group_size": group_size,
                "quantized_linear_layers": layers,
                "eval_ppl": perplexity(model, held_out),
                "calib64_ppl": perplexity(model, calib[:64]),
            }
        )
        print(
            f"{label:30s} eval {rows[-1]['eval_ppl']:.3f}  calib[:64] {rows[-1]['calib64_ppl']:.3f}"
        )
    return rows


def versions() -> dict[str, str]:
    from importlib.metadata import version

    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "tokenizers", "numpy"):
        found[name] = version(name)
    return found


# ---------------------------------------------------------------------------------------------
# The run


def portable_tokenizer_config(path: Path) -> None:
    """Name the tokenizer class every transformers version (4 and 5) and vLLM resolve:
    transformers 5 writes its own ``TokenizersBackend``, which older readers do not know."""
    config = json.loads(path.read_text())
    config.pop("backend", None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_json(path, config)


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=1) + "\n")


def run(out: Path, recipe: Recipe, stdlib: Path) -> None:
    torch.set_num_threads(recipe.threads)
    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".train-", dir=out))
    try:
        corpus = collect_corpus(stdlib, SEED)
        train_texts, held_out_texts = list(corpus.train.values()), list(corpus.held_out.values())
        print(f"{len(train_texts)} training files, {len(held_out_texts)} held out", flush=True)
        tokenizer = train_tokenizer(train_texts)
        train_stream = token_stream(tokenizer, train_texts)
        held_out_stream = token_stream(tokenizer, held_out_texts)
        train_bytes = sum(len(t.encode()) for t in train_texts)
        print(
            f"{len(train_stream):,} training tokens ({train_bytes / len(train_stream):.2f} bytes/token)"
        )
        calib = calibration_windows(train_stream, CALIB_ROWS, SEED + 1)
        held_out = evaluation_windows(held_out_stream, EVAL_ROWS, SEED + 2)

        torch.manual_seed(SEED)
        model = LlamaForCausalLM(model_config())
        history = train(model, train_stream, held_out, recipe, SEED + 3)
        train_seconds = history[-1]["seconds"]

        model.to(torch.bfloat16).save_pretrained(staging)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT
        )
        fast.save_pretrained(staging)
        portable_tokenizer_config(staging / "tokenizer_config.json")
        np.save(staging / "calib.npy", calib)
        np.save(staging / "eval.npy", held_out)
        write_json(
            staging / "split.json",
            {
                "seed": SEED,
                "stdlib": "the running interpreter's sysconfig 'stdlib' path",
                "train": sorted(corpus.train),
                "held_out": sorted(corpus.held_out),
                "folders_not_read": [*SKIPPED_FOLDERS, "config-*"],
                "skipped": dict(sorted(corpus.skipped.items())),
            },
        )
        results = measure(staging, calib, held_out)
        write_json(
            staging / "results.json",
            {
                "recipe": asdict(recipe),
                "seed": SEED,
                "parameters": sum(p.numel() for p in model.parameters()),
                "files": {"train": len(train_texts), "held_out": len(held_out_texts)},
                "tokens": {
                    "train_stream": int(len(train_stream)),
                    "held_out_stream": int(len(held_out_stream)),
                    "seen_in_training": recipe.steps * recipe.batch_size * SEQ_LEN,
                    "train_bytes_per_token": round(train_bytes / len(train_stream), 3),
                },
                "seconds": {
                    "training": train_seconds,
                    "total": round(time.perf_counter() - began, 1),
                },
                "versions": versions(),
                "history": history,
                "results": results,
            },
        )
        for name in OUTPUT_FILES:
            (staging / name).chmod(0o644)  # some writers create private files; these are shared
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def evaluate_only(folder: Path) -> None:
    """Recompute results.json's table from the saved weights and token arrays."""
    results_path = folder / "results.json"
    record = json.loads(results_path.read_text())
    record["results"] = measure(folder, np.load(folder / "calib.npy"), np.load(folder / "eval.npy"))
    staged = results_path.with_suffix(".json.tmp")
    write_json(staged, record)
    os.replace(staged, results_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write (default: here)")
    parser.add_argument("--steps", type=int, default=Recipe.steps)
    parser.add_argument("--threads", type=int, default=Recipe.threads)
    parser.add_argument(
        "--stdlib",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="the folder of .py files to learn from (default: this interpreter's standard library)",
    )
    parser.add_argument("--evaluate-only", action="store_true")
    args = parser.parse_args(argv)
    if args.evaluate_only:
        evaluate_only(args.out)
        return 0
    if not args.stdlib.is_dir():
        print(f"error: no standard library at {args.stdlib}; pass --stdlib DIR", file=sys.stderr)
        return 2
    run(args.out, Recipe(steps=args.steps, threads=args.threads), args.stdlib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
