"""Multimodal test material made offline: twins saved with processors, drawn images, tones.

Importable by any test (`from tests.multimodal import TWINS, TwinFolders, ...`). Twins are
written once per session by `TwinFolders` and shared: a test that changes a folder copies it
first (`copy_twin`).
"""

from __future__ import annotations

import json
import math
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

from llmc_trace.data import load_processor
from llmc_trace.data.drawn import write_drawn_dataset
from llmc_trace.twins.save import save_twin

#: The six architectures of issue 35's acceptance, by built-in name, with their modality.
TWINS: dict[str, str] = {
    "Qwen/Qwen2-VL-2B-Instruct": "image",
    "Qwen/Qwen2.5-VL-7B-Instruct": "image",
    "llava-hf/llava-1.5-7b-hf": "image",
    "HuggingFaceTB/SmolVLM-Instruct": "image",
    "google/gemma-3-4b-it": "image",
    "Qwen/Qwen2-Audio-7B-Instruct": "audio",
}


def narrow_gemma3(config: PretrainedConfig) -> None:
    """Gemma 3's twin keeps 6 layers of width 1280 (a sliding-window period, 4 heads of 256):
    7 s a forward here. Two layers (one sliding, one full) of width 256 keep its code paths."""
    text = config.text_config
    text.hidden_size, text.intermediate_size, text.head_dim = 256, 512, 64
    text.num_attention_heads, text.num_key_value_heads = 4, 1
    text.layer_types = ["sliding_attention", "full_attention"]
    text.num_hidden_layers = 2


def narrow_qwen_mlp(config: PretrainedConfig) -> None:
    """Qwen2-VL's and Qwen2.5-VL's twins keep an MLP of 4480 and 4736 (their full size over two
    and four), InternVL3's Qwen2 text stack one of 2432: GPTQ on that down projection (a
    4480-wide Hessian to factor) is most of a compress test's time. The MLP's width takes no
    code path of its own."""
    config.text_config.intermediate_size = 1024


def short_audio_window(config: PretrainedConfig) -> None:
    """Qwen2-Audio's encoder takes a 30 s window (1500 positions) however short the clip, and
    the tests' tones last 1 to 2.5 s: a 5 s window (the processor's follows the config) keeps
    every code path, the padded frames and their mask included, at a sixth of the encoder's
    work."""
    config.audio_config.max_source_positions = 250


#: Config changes that keep a twin's tests fast.
ADJUST = {
    "Qwen/Qwen2-Audio-7B-Instruct": short_audio_window,
    "google/gemma-3-4b-it": narrow_gemma3,
    "Qwen/Qwen2-VL-2B-Instruct": narrow_qwen_mlp,
    "Qwen/Qwen2.5-VL-7B-Instruct": narrow_qwen_mlp,
    "OpenGVLab/InternVL3-1B-hf": narrow_qwen_mlp,
}


class TwinFolders:
    """Twins saved under one root, each written on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, name: str) -> Path:
        folder = self.root / name.replace("/", "--")
        if not (folder / "config.json").is_file():
            save_twin(name, folder, adjust=ADJUST.get(name))
        return folder


def skip_unless_processable(folder: Path, modality: str) -> None:
    """Skip where this install cannot preprocess ``modality`` for the twin in ``folder``, with
    the processor's own reason (SmolVLM's image processor needs torchvision on transformers
    5.17); the message a user gets then is tested apart."""
    unavailable = load_processor(folder).unavailable
    if modality in unavailable:
        pytest.skip(unavailable[modality])


def load_twin(folder: Path) -> PreTrainedModel:
    """The saved twin with eager attention, in float32 (LLaVA's config says float16, whose
    rounding would differ between a padded batch and a row alone), in eval mode."""
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


def copy_twin(folder: Path, target: Path) -> Path:
    shutil.copytree(folder, target)
    return target


def write_images(folder: Path, count: int = 6, seed: int = 0) -> Path:
    """Drawn images in three sizes and their captions: `folder/captions.jsonl`."""
    return write_drawn_dataset(folder, count=count, seed=seed)


def write_tone(path: Path, seconds: float, rate: int, frequency: float, width: int = 2) -> None:
    """A sine tone as PCM `.wav` (`width` bytes per sample), with the standard library."""
    count = int(seconds * rate)
    samples = 0.5 * np.sin(2 * math.pi * frequency * np.arange(count) / rate)
    if width == 1:
        data = (samples * 127 + 128).astype(np.uint8).tobytes()
    else:
        data = (samples * 32767).astype(np.int16).tobytes()
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(data)


def write_tones(folder: Path, count: int = 4) -> Path:
    """`count` tones of different lengths and rates with a caption each: `folder/audio.jsonl`."""
    (folder / "audio").mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(count):
        rate = (16000, 8000)[index % 2]  # 8 kHz rows are resampled to the extractor's 16 kHz
        write_tone(folder / f"audio/{index}.wav", 1.0 + index / 2, rate, 220.0 * (index + 1))
        rows.append(
            {"audio": f"audio/{index}.wav", "text": f"{('one', 'two', 'three')[index % 3]} tone ."}
        )
    path = folder / "audio.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
