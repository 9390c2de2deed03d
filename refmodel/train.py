"""Train llmc-trace's reference models: a small Llama (and its MoE variant) that learned Python.

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
  (arguments, versions, training history, timings, the perplexity table the README quotes and,
  for a mixture of experts, each layer's expert load).

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
    python refmodel/train.py --evaluate-only     # recompute results.json's measured part

``--arch moe`` applies the same recipe to a mixture-of-experts variant (``Qwen3MoeForCausalLM``,
written to ``moe/``), so that compressing experts is measured for quality on weights that learned
something too. It reads the Llama's tokenizer, split and token windows from this folder instead of
deriving its own (after checking that this interpreter's standard library splits the same way), so
both models see the same vocabulary and training stream and are scored on the same rows:

    python refmodel/train.py --arch moe          # about 15 min on 2 cores, writes into refmodel/moe/
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
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
#: The data files the MoE reads from the Llama's folder instead of keeping copies of its own
#: (the repository travels to GPU machines under a size limit).
SHARED_DATA_FILES = ("calib.npy", "eval.npy", "split.json")


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


@dataclass(frozen=True)
class Data:
    """What training and measurement read, and what the output folder records of the data."""

    corpus: Corpus
    tokenizer: Tokenizer
    train_stream: np.ndarray
    held_out_stream: np.ndarray
    calib: np.ndarray
    held_out: np.ndarray


class SplitMismatch(ValueError):
    """The standard library at hand does not reproduce the data the Llama was trained on."""


def fresh_data(stdlib: Path) -> Data:
    """The corpus of ``stdlib``, a tokenizer trained on its training files, and their windows."""
    corpus = collect_corpus(stdlib, SEED)
    train_texts = list(corpus.train.values())
    tokenizer = train_tokenizer(train_texts)
    train_stream = token_stream(tokenizer, train_texts)
    held_out_stream = token_stream(tokenizer, list(corpus.held_out.values()))
    return Data(
        corpus,
        tokenizer,
        train_stream,
        held_out_stream,
        calibration_windows(train_stream, CALIB_ROWS, SEED + 1),
        evaluation_windows(held_out_stream, EVAL_ROWS, SEED + 2),
    )


def reference_data(stdlib: Path) -> Data:
    """The Llama's data, read back from this folder: its tokenizer, its calibration and
    evaluation windows, and the training stream that tokenizer makes of the same split.

    Sharing it keeps the models comparable (one vocabulary, one training stream, the same
    evaluation rows) and skips retraining the tokenizer. The split is checked against
    ``split.json`` and the re-derived evaluation windows against ``eval.npy``: another standard
    library would train on files the Llama held out and score rows it never saw.
    """
    corpus = collect_corpus(stdlib, SEED)
    split = json.loads((HERE / "split.json").read_text())
    if [sorted(corpus.train), sorted(corpus.held_out)] != [split["train"], split["held_out"]]:
        raise SplitMismatch(
            f"the standard library at {stdlib} does not split into the files {HERE / 'split.json'} "
            "lists; pass --stdlib with the Python that trained the Llama (results.json names its "
            "version), or retrain the Llama first"
        )
    tokenizer = Tokenizer.from_file(str(HERE / "tokenizer.json"))
    held_out_stream = token_stream(tokenizer, list(corpus.held_out.values()))
    held_out = np.load(HERE / "eval.npy")
    if not np.array_equal(evaluation_windows(held_out_stream, EVAL_ROWS, SEED + 2), held_out):
        raise SplitMismatch(
            f"{HERE / 'tokenizer.json'} no longer encodes the held-out files into "
            f"{HERE / 'eval.npy'} (another tokenizers version?); retrain the Llama first"
        )
    return Data(
        corpus,
        tokenizer,
        token_stream(tokenizer, list(corpus.train.values())),
        held_out_stream,
        np.load(HERE / "calib.npy"),
        held_out,
    )


# ---------------------------------------------------------------------------------------------
# Model, training and measurement


#: What the two models share: widths, depth, attention, positions, token ids.
SHAPE: dict[str, Any] = dict(
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


def model_config() -> LlamaConfig:
    """A 6-layer Llama with grouped-query attention whose every Linear input is a multiple of
    128 wide, so group sizes 32, 64 and 128 apply to every layer."""
    return LlamaConfig(**SHAPE)


def moe_config() -> Qwen3MoeConfig:
    """The Llama's shape with each MLP replaced by 8 SwiGLU experts, 2 of them per token.

    An expert is half the Llama's MLP width (384), so a token's two experts hold as many weights
    as the Llama's MLP: active parameters match it (the router aside) while the total grows.
    Input widths 256 and 384 are multiples of 128, as in the Llama. Otherwise Qwen3-MoE's own
    choices: every layer sparse, no shared expert, the two routing weights renormalised to sum
    to 1, RMSNorm on each query and key head. The load-balancing loss is weighted 0.01, Switch
    Transformer's alpha (Qwen3 ships 0.001, chosen for 128 experts and far longer training), so
    that a few hundred steps suffice to spread the tokens over the experts.
    """
    return Qwen3MoeConfig(
        **SHAPE,  # its intermediate_size is unused: every layer is sparse
        moe_intermediate_size=384,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=0.01,
    )


@dataclass(frozen=True)
class Architecture:
    """What one trained model does not share with the other: its class, shape, folder, step
    count, and where its data comes from. Corpus, training loop, measurement and files are
    common, so the two are trained and measured the same way."""

    model_class: type[PreTrainedModel]
    config: Callable[[], PreTrainedConfig]
    folder: Path
    steps: int
    data: Callable[[Path], Data]
    files: tuple[str, ...] = OUTPUT_FILES


ARCHITECTURES = {
    "llama": Architecture(LlamaForCausalLM, model_config, HERE, Recipe.steps, fresh_data),
    # a routed step costs about 1.3x the Llama's (1.55 s on 2 free cores): 600 take 15 minutes
    "moe": Architecture(
        Qwen3MoeForCausalLM,
        moe_config,
        HERE / "moe",
        600,
        reference_data,
        tuple(name for name in OUTPUT_FILES if name not in SHARED_DATA_FILES),
    ),
}


def routes_tokens(config: PreTrainedConfig) -> bool:
    """Whether the model sends each token to a few of its experts (and has a router to balance)."""
    return getattr(config, "num_experts_per_tok", None) is not None


def active_parameters(model) -> int:
    """Parameters one token's forward pass uses: all but the experts its router passes over."""
    total = sum(p.numel() for p in model.parameters())
    if not routes_tokens(model.config):
        return total
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    idle = 1 - model.config.num_experts_per_tok / model.config.num_experts
    return total - round(experts * idle)


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


def balance_loss(router_logits: tuple[torch.Tensor, ...], top_k: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss (Fedus et al. 2021, https://arxiv.org/abs/2101.03961,
    eq. 4) of each MoE layer on its own, averaged over layers: ``num_experts * sum_i f_i P_i``,
    with ``f_i`` the share of the layer's top-k slots routed to expert ``i`` and ``P_i`` its
    mean router probability; 1 when balanced, ``num_experts`` when one expert takes all.

    transformers' ``load_balancing_loss_func`` pools the counts of all layers before
    multiplying, so an expert busy in one layer offsets its idle namesake in another: trained
    with it (same recipe), the MoE routed no token of ``eval.npy`` to 4 of its 48 experts and
    under 1 % of a layer's slots to 3 more.
    """
    losses = []
    for logits in router_logits:  # each (tokens, num_experts)
        probabilities = torch.softmax(logits.float(), dim=-1)
        chosen = probabilities.topk(top_k, dim=-1).indices
        shares = torch.nn.functional.one_hot(chosen, logits.shape[-1]).float().mean(dim=(0, 1))
        losses.append(logits.shape[-1] * (shares * probabilities.mean(dim=0)).sum())
    return torch.stack(losses).mean()


def training_loss(model, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise, and its parts to log: next-token cross-entropy, plus for a routed
    model ``balance_loss`` weighted by ``router_aux_loss_coef``, which keeps each router from
    sending most tokens to a few experts. The cross-entropy is logged alone, so it compares
    across architectures."""
    if not routes_tokens(model.config):
        loss = model(input_ids=batch, labels=batch).loss
        return loss, {"train_loss": loss.item()}
    outputs = model(input_ids=batch, output_router_logits=True)
    cross_entropy = model.loss_function(outputs.logits, batch, model.config.vocab_size)
    balance = balance_loss(outputs.router_logits, model.config.num_experts_per_tok)
    loss = cross_entropy + model.config.router_aux_loss_coef * balance
    return loss, {"train_loss": cross_entropy.item(), "balance_loss": balance.item()}


def train(model, stream: np.ndarray, held_out: np.ndarray, recipe: Recipe, seed: int) -> list:
    """Next-token training on random windows of the stream; returns the logged history."""
    optimizer = optimizer_for(model, recipe)
    offsets = np.random.default_rng(seed)
    history: list[dict[str, float]] = []
    smoothed: dict[str, float] = {}
    started = time.perf_counter()
    model.train()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe)
        starts = offsets.integers(0, len(stream) - SEQ_LEN + 1, size=recipe.batch_size)
        batch = torch.as_tensor(
            np.stack([stream[s : s + SEQ_LEN] for s in starts]), dtype=torch.long
        )
        loss, parts = training_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip_norm)
        optimizer.step()
        for name, value in parts.items():
            smoothed[name] = value if name not in smoothed else 0.95 * smoothed[name] + 0.05 * value
        last = step == recipe.steps - 1
        if (step + 1) % recipe.log_every == 0 or last:
            elapsed = time.perf_counter() - started
            row = {
                "step": step + 1,
                "tokens": (step + 1) * recipe.batch_size * SEQ_LEN,
                **{f"{name}_ema": round(value, 4) for name, value in smoothed.items()},
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
                f"step {step + 1}/{recipe.steps}  loss {smoothed['train_loss']:.3f}  {rate:.0f} tokens/s"
                + (
                    f"  balance {smoothed['balance_loss']:.3f}"
                    if "balance_loss" in smoothed
                    else ""
                )
                + (f"  val ppl {row['val_ppl']:.1f}" if "val_ppl" in row else ""),
                flush=True,
            )
    model.eval()
    return history


#: The 3-D parameters transformers 5 stacks a MoE layer's experts into, ``(experts, out, in)``,
#: and how many of the published checkpoint's per-expert Linear layers each expert's slice
#: holds (``gate_up_proj`` is ``gate_proj`` and ``up_proj`` stacked along ``out``).
FUSED_EXPERT_LINEARS = {"gate_up_proj": 2, "down_proj": 1}


def round_rows_(weight: torch.Tensor, bits: int, group_size: int | None) -> None:
    """Fake-quantize ``weight`` (..., out, in) in place: symmetric, ``max|w| / (2^(b-1) - 1)``
    per group of ``group_size`` input columns (a whole row when None)."""
    columns = weight.shape[-1]
    width = group_size or columns
    groups = weight.float().reshape(-1, columns // width, width)
    top = 2 ** (bits - 1) - 1
    scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / top
    quantized = torch.clamp(torch.round(groups / scale), -top - 1, top) * scale
    weight.copy_(quantized.reshape(weight.shape))


def round_to_nearest_(model, bits: int, group_size: int | None) -> int:
    """Fake-quantize every decoder Linear in place with ``round_rows_``, experts included
    (each expert's rows are rounded on their own, as in its per-expert Linear). Routers stay
    as they are (they are no Linear, and MoE recipes leave ``mlp.gate`` out too). Returns how
    many Linear layers the published checkpoint has for what was rounded."""
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
                round_rows_(module.weight, bits, group_size)
                count += 1
            for attribute, linears in FUSED_EXPERT_LINEARS.items():
                experts = getattr(module, attribute, None)
                if isinstance(experts, torch.nn.Parameter) and experts.ndim == 3:
                    round_rows_(experts, bits, group_size)
                    count += linears * experts.shape[0]
    return count


QUANTIZED_ROWS = (
    ("RTN W4 per channel", 4, None),
    ("RTN W4 group 128", 4, 128),
    ("RTN W3 group 128", 3, 128),
    ("RTN W2 group 64", 2, 64),
)


def expert_load(model, rows: np.ndarray, batch_size: int = 8) -> list[list[float]]:
    """Per layer, each expert's share of the tokens' top-k routing slots over ``rows`` (a layer
    sums to 1; 1 / num_experts each when balanced, near 1 for one expert when collapsed)."""
    counts = None
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            ids = torch.as_tensor(rows[start : start + batch_size], dtype=torch.long)
            logits = torch.stack(model(input_ids=ids, output_router_logits=True).router_logits)
            chosen = logits.topk(model.config.num_experts_per_tok, dim=-1).indices  # (L, tokens, k)
            found = torch.nn.functional.one_hot(chosen, model.config.num_experts).sum(dim=(1, 2))
            counts = found if counts is None else counts + found  # (L, experts)
    shares = counts / counts.sum(dim=-1, keepdim=True)
    return [[round(share, 4) for share in layer] for layer in shares.tolist()]


def load(folder: Path):
    """The saved model in float32, as the perplexity table computes it."""
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def perplexity_table(folder: Path, calib: np.ndarray, held_out: np.ndarray) -> list[dict]:
    """Perplexity of the saved bf16 weights computed in float32, and of round-to-nearest."""
    rows = []
    for label, bits, group_size in (("bf16 weights, fp32 compute", None, None), *QUANTIZED_ROWS):
        model = load(folder)
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


def measure(folder: Path, calib: np.ndarray, held_out: np.ndarray) -> dict:
    """results.json's measured part: the perplexity table, and for a routed model the experts'
    load on the evaluation rows, which shows whether training spread the tokens over them."""
    measured: dict = {"results": perplexity_table(folder, calib, held_out)}
    model = load(folder)
    if routes_tokens(model.config):
        measured["expert_load_eval"] = expert_load(model, held_out)
        for layer, shares in enumerate(measured["expert_load_eval"]):
            print(f"layer {layer} expert load " + " ".join(f"{share:.3f}" for share in shares))
    return measured


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


def write_data(folder: Path, data: Data) -> None:
    """The tokenizer, the token windows and the split, as ``from_pretrained`` and tests read them."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=data.tokenizer, bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT
    )
    fast.save_pretrained(folder)
    portable_tokenizer_config(folder / "tokenizer_config.json")
    np.save(folder / "calib.npy", data.calib)
    np.save(folder / "eval.npy", data.held_out)
    write_json(
        folder / "split.json",
        {
            "seed": SEED,
            "stdlib": "the running interpreter's sysconfig 'stdlib' path",
            "train": sorted(data.corpus.train),
            "held_out": sorted(data.corpus.held_out),
            "folders_not_read": [*SKIPPED_FOLDERS, "config-*"],
            "skipped": dict(sorted(data.corpus.skipped.items())),
        },
    )


def run(out: Path, recipe: Recipe, stdlib: Path, architecture: Architecture) -> None:
    torch.set_num_threads(recipe.threads)
    began = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".train-", dir=out))
    try:
        data = architecture.data(stdlib)
        train_texts = list(data.corpus.train.values())
        print(
            f"{len(train_texts)} training files, {len(data.corpus.held_out)} held out", flush=True
        )
        train_bytes = sum(len(t.encode()) for t in train_texts)
        train_stream = data.train_stream
        print(
            f"{len(train_stream):,} training tokens ({train_bytes / len(train_stream):.2f} bytes/token)"
        )

        torch.manual_seed(SEED)
        model = architecture.model_class(architecture.config())
        cpu_began = time.process_time()
        history = train(model, train_stream, data.held_out, recipe, SEED + 3)
        train_seconds = history[-1]["seconds"]
        # on a shared machine wall time says little; CPU time / threads is the uncontended wall
        train_cpu_seconds = round(time.process_time() - cpu_began, 1)

        model.to(torch.bfloat16).save_pretrained(staging)
        write_data(staging, data)
        measured = measure(staging, data.calib, data.held_out)
        write_json(
            staging / "results.json",
            {
                "recipe": asdict(recipe),
                "seed": SEED,
                "parameters": sum(p.numel() for p in model.parameters()),
                "active_parameters": active_parameters(model),
                "files": {"train": len(train_texts), "held_out": len(data.corpus.held_out)},
                "tokens": {
                    "train_stream": int(len(train_stream)),
                    "held_out_stream": int(len(data.held_out_stream)),
                    "seen_in_training": recipe.steps * recipe.batch_size * SEQ_LEN,
                    "train_bytes_per_token": round(train_bytes / len(train_stream), 3),
                },
                "seconds": {
                    "training": train_seconds,
                    "training_cpu": train_cpu_seconds,
                    "total": round(time.perf_counter() - began, 1),
                },
                "versions": versions(),
                "history": history,
                **measured,
            },
        )
        for name in architecture.files:
            (staging / name).chmod(0o644)  # some writers create private files; these are shared
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def evaluate_only(folder: Path) -> None:
    """Recompute results.json's measured part from the saved weights and token arrays."""
    results_path = folder / "results.json"
    record = json.loads(results_path.read_text())
    data = folder if (folder / "calib.npy").is_file() else HERE  # the MoE reads the Llama's
    record |= measure(folder, np.load(data / "calib.npy"), np.load(data / "eval.npy"))
    staged = results_path.with_suffix(".json.tmp")
    write_json(staged, record)
    os.replace(staged, results_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch",
        choices=sorted(ARCHITECTURES),
        default="llama",
        help="llama: the reference model, written here; moe: its mixture-of-experts variant, "
        "written to moe/ (default: llama)",
    )
    parser.add_argument("--out", type=Path, help="folder to write (default: the --arch's folder)")
    parser.add_argument(
        "--steps", type=int, help="training steps (default: 1450 for llama, 600 for moe)"
    )
    parser.add_argument("--threads", type=int, default=Recipe.threads)
    parser.add_argument(
        "--stdlib",
        type=Path,
        default=Path(sysconfig.get_paths()["stdlib"]),
        help="the folder of .py files to learn from (default: this interpreter's standard library)",
    )
    parser.add_argument("--evaluate-only", action="store_true")
    args = parser.parse_args(argv)
    architecture = ARCHITECTURES[args.arch]
    out = args.out or architecture.folder
    if args.evaluate_only:
        evaluate_only(out)
        return 0
    if not args.stdlib.is_dir():
        print(f"error: no standard library at {args.stdlib}; pass --stdlib DIR", file=sys.stderr)
        return 2
    recipe = Recipe(steps=args.steps or architecture.steps, threads=args.threads)
    try:
        run(out, recipe, args.stdlib, architecture)
    except SplitMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
