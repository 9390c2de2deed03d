"""compress calibrates a vision-language model on its own images, through the sequential
pipeline, and writes a checkpoint transformers reloads, processor included, to our logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from llmc_trace import CompressRequest, compress
from llmc_trace.data.multimodal import load_multimodal_calibration
from llmc_trace.data.processor import load_processor
from tests.multimodal import TwinFolders, write_images

QWEN2_VL = "Qwen/Qwen2-VL-2B-Instruct"


@pytest.fixture(scope="module")
def qwen2_vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Qwen2-VL's twin saved with its processor, and drawn images in three sizes."""
    root = tmp_path_factory.mktemp("vlm")
    return TwinFolders(root / "twins")(QWEN2_VL), write_images(root / "rows", count=6)


def test_images_calibrate_through_the_sequential_pipeline_and_reload(
    qwen2_vl: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, rows = qwen2_vl
    arguments = dict(samples=4, seq_len=256, batch_size=2, pipeline="sequential")
    out = tmp_path / "out"
    streamed = compress(CompressRequest(folder, rows, out, **arguments))
    in_memory = compress(CompressRequest(folder, rows, None, **arguments))
    assert streamed.pipeline == in_memory.pipeline == "sequential" and not streamed.fallbacks
    assert [r.name for r in streamed.layers] == [r.name for r in in_memory.layers]
    assert all(r.name.startswith("model.language_model.") for r in streamed.layers)
    # the image tokens reached the Hessians: more tokens than the captions alone hold
    text = {**arguments, "seq_len": 8, "modality": "text"}  # the captions alone, packed
    captions = compress(CompressRequest(folder, rows, None, **text))
    assert streamed.layers[0].num_tokens > 2 * captions.layers[0].num_tokens

    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["calibration"]["modality"] == "image"
    assert (out / "preprocessor_config.json").is_file() and (out / "chat_template.jinja").is_file()
    # loads as the original's does (AutoProcessor where torchvision is installed, else from
    # its parts: transformers' Qwen2-VL processor checks its video part against torchvision)
    saved, original = load_processor(out).processor, load_processor(folder).processor
    assert type(saved).__name__ == type(original).__name__ == "Qwen2VLProcessor"
    assert saved.image_processor.to_dict() == original.image_processor.to_dict()
    assert saved.tokenizer.get_vocab() == original.tokenizer.get_vocab()

    batch = load_multimodal_calibration(rows, out, samples=2, seq_len=256, batch_size=2).batches[0]
    # compare in the stored dtype, kernel for kernel (calibration ran sdpa): dequantizing in
    # float32 would round differently from the bf16 weights our model holds
    architecture = getattr(
        transformers, json.loads((out / "config.json").read_text())["architectures"][0]
    )
    reloaded = architecture.from_pretrained(out, attn_implementation="eager").eval()
    ours = in_memory.model.eval()
    ours.set_attn_implementation("eager")
    assert reloaded.dtype == ours.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, ours(**batch).logits)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]
