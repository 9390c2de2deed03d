"""Shared fixtures: tiny seeded models built from configs, and the reference model's folder.

transformers' model classes are imported where a model is built: under ``-n 2`` this module
is also imported by pytest's controlling process, which runs no test, and their imports cost
it seconds of the two cores the workers start on.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from refmodel import FOLDER as REFMODEL

from tests.float32_cpu import hide_half_precision_units

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

REPO = Path(__file__).resolve().parents[1]


def shipped_types(*model_types: str) -> pytest.MarkDecorator:
    """Skip where the installed transformers ships no model of one of ``model_types``: a test
    of a type added after the oldest release llmc-trace supports (5.17)."""
    import transformers

    missing = [t for t in model_types if t not in transformers.CONFIG_MAPPING]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"transformers {transformers.__version__} has no {', '.join(missing)} models",
    )


def default_builds(*model_types: str) -> pytest.MarkDecorator:
    """Skip where the installed transformers cannot build one of ``model_types``' default
    configs: 5.17 refuses a composite config without its sub-configs (the encoder-decoders,
    MusicGen), which later releases fill in with defaults of their own."""
    import transformers

    from llmc_trace.models.defaults import default_config

    refused = []
    for model_type in model_types:
        try:
            default_config(model_type)
        except Exception as err:  # noqa: BLE001 - whatever the release says, it says no
            refused.append(f"{model_type} ({type(err).__name__})")
    return pytest.mark.skipif(
        bool(refused),
        reason=f"transformers {transformers.__version__} builds no default config of "
        f"{', '.join(refused)}",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n N`` each worker gets its share of the cores: N workers of torch's default
    (one thread per core each) oversubscribe the machine, and the suite's heaviest tests ran
    2-3x slower beside each other than alone. Child processes inherit the share through
    ``OMP_NUM_THREADS``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (half a minute or more each) run first, the rest in their order:
    under ``-n 2 --dist worksteal`` the short ones then fill in around the long ones, instead
    of one long test starting last and leaving the other worker idle to its end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def float32_cpu_forwards() -> Iterator[None]:
    """Every test sees a CPU without half-precision matrix units, so bf16 checkpoints calibrate
    in float32 on every machine that runs the suite, with or without AVX512-BF16: tests that
    compare compressed weights or logits at tight tolerances then give the same answer
    everywhere. Session-wide, so that module and session fixtures (a reference checkpoint
    computed once) see it too. A test of the native path sets the probes itself
    (``tests/test_device.py``); subprocesses see the real CPU, unless run through
    ``tests/float32_cpu.py``."""
    with pytest.MonkeyPatch.context() as patch:
        hide_half_precision_units(patch)
        yield


@pytest.fixture(autouse=True)
def ctrl_c_restored() -> Iterator[None]:
    """A command run in this process that answers an interrupt ignores further Ctrl-C's until
    its process ends (``cli.context.ignore_interrupts``); here the process is the test run,
    which gets its own handler back after the test."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run the test on one torch thread, restoring the setting after it: compressing and
    tracing tiny models are many tiny ops, which a second thread only slows on a busy 2-core
    machine (a built-in sweep took 10 minutes so, 1.5 with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def refmodel_result(config: str = "bf16 weights, fp32 compute") -> dict[str, float]:
    """One row of the reference model's own ``results.json`` (``eval_ppl``, ``calib64_ppl``),
    the figures its training script measured: tests compare with these, never with numbers
    copied from an earlier run."""
    rows = json.loads((REFMODEL / "results.json").read_text())["results"]
    return next(row for row in rows if row["config"] == config)


def tiny_llama(
    layers: int = 3, seed: int = 0, hidden: int = 64, attention: str = "eager"
) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation=attention).eval()


@pytest.fixture
def saved_llama(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny random Llama saved as safetensors, and a token array to calibrate it with."""
    folder = tmp_path / "tiny"
    tiny_llama(layers=2, hidden=128).save_pretrained(folder)
    tokens = np.random.default_rng(0).integers(0, 128, size=(8, 64)).astype(np.int32)
    np.save(tmp_path / "calib.npy", tokens)
    return folder, tmp_path / "calib.npy"


def token_batch(
    batch: int = 2, seq: int = 16, vocab: int = 128, seed: int = 0
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, : seq // 4] = 0  # left padding: the causal mask and the padding both matter
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture
def llama() -> LlamaForCausalLM:
    return tiny_llama()


#: The files a language reference model's folder (``FOLDER``, ``MOE_FOLDER``) cannot lack.
LANGUAGE_REFMODEL_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "calib.npy",
    "eval.npy",
)


def require_refmodel(
    folder: Path = REFMODEL, files: tuple[str, ...] = LANGUAGE_REFMODEL_FILES
) -> Path:
    """A reference model's folder (``refmodel.FOLDER``, ``MOE_FOLDER`` or ``VLM_FOLDER``, whose
    ``files`` differ), failing (never skipping) when one of ``files`` is missing: it is part of
    the repository, and the quality tests are the ones that must not go quiet."""
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        pytest.fail(
            f"the reference model's {', '.join(missing)} is missing from {folder}: restore it "
            "with `git checkout -- refmodel` or remake it with `python refmodel/train.py` "
            "(`train_vlm.py` for the vision-language model; see refmodel/README.md)"
        )
    return folder


@pytest.fixture(scope="session")
def refmodel_dir() -> Path:
    return require_refmodel()


def tiny_gpt2(*, tie_word_embeddings: bool = True) -> GPT2LMHeadModel:
    """A 2-layer GPT-2 (Conv1D layers, widths 64 and 256) with seeded random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=128,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="session")
def twins(tmp_path_factory: pytest.TempPathFactory):
    """`twins(name)`: the folder of built-in `name`'s tiny twin saved with its processor,
    written once per session (tests that change it copy it first)."""
    from tests.multimodal import TwinFolders

    return TwinFolders(tmp_path_factory.mktemp("twins"))


@pytest.fixture(scope="session")
def drawn_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six drawn images in three sizes with captions: a `.jsonl` of image paths and texts."""
    from tests.multimodal import write_images

    return write_images(tmp_path_factory.mktemp("drawn"), count=6)


@pytest.fixture(scope="session")
def tone_rows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four captioned tones as .wav files, at 16 and 8 kHz: a `.jsonl` of paths and texts."""
    from tests.multimodal import write_tones

    return write_tones(tmp_path_factory.mktemp("tones"), count=4)
