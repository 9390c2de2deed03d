"""compress calibrates vision-language and audio models on their own media, through the
sequential pipeline, and writes checkpoints transformers reloads, processor included, to our
logits and our perplexity."""

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
from llmc_trace.evaluate import evaluate_model
from llmc_trace.evaluate.perplexity import perplexity
from llmc_trace.models.parts import model_parts
from tests.multimodal import TWINS, skip_unless_processable

#: Group size 32 divides every twin's widths (LLaVA's and Qwen2-Audio's MLP, 1376 = 11008 / 8,
#: does not take 128, as their full-size 11008 does not either).
RUN = dict(samples=4, seq_len=512, batch_size=2, pipeline="sequential", group_size=32)


def _rows(name: str, drawn_rows: Path, tone_rows: Path) -> Path:
    return tone_rows if TWINS[name] == "audio" else drawn_rows


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TWINS))
def test_media_calibrate_through_the_sequential_pipeline_and_reload(
    name: str, twins, drawn_rows: Path, tone_rows: Path, tmp_path: Path
) -> None:
    folder, rows, modality = twins(name), _rows(name, drawn_rows, tone_rows), TWINS[name]
    skip_unless_processable(folder, modality)
    out = tmp_path / "out"
    streamed = compress(CompressRequest(folder, rows, out, modality=modality, **RUN))
    in_memory = compress(CompressRequest(folder, rows, None, modality=modality, **RUN))
    assert streamed.pipeline == in_memory.pipeline == "sequential" and not streamed.fallbacks
    assert [r.name for r in streamed.layers] == [r.name for r in in_memory.layers]
    ours = in_memory.model.eval()
    parts = model_parts(ours)
    assert {parts.part_of(r.name) for r in streamed.layers} == {"language model"}
    rows_of = {row.kind: row for row in streamed.stages[-1].coverage}
    tower = "audio tower" if modality == "audio" else "vision tower"
    assert rows_of[tower].compressed == 0 < rows_of[tower].total
    assert rows_of["attention"].compressed == rows_of["attention"].total

    # the report counts the tokens calibration saw (not the --seq-len bound), media among them
    seen = load_multimodal_calibration(rows, folder, samples=4, seq_len=512, batch_size=2)
    settings = streamed.report.settings
    assert settings.tokens == sum(int(b["attention_mask"].sum()) for b in seen.batches) < 4 * 512
    media = sum(int((b["input_ids"] == seen.media_token_id).sum()) for b in seen.batches)
    assert settings.media_tokens == media > 0
    header = f"4 samples, {settings.tokens} tokens ({media} of them media placeholders)"
    assert header in (out / "report.html").read_text()

    # the processor files travel, and the recipe says what made the checkpoint: loads as the
    # original's does (AutoProcessor where it can, else from its parts: transformers' Qwen2-VL
    # processor checks its video part against torchvision)
    saved, original = load_processor(out).processor, load_processor(folder).processor
    assert type(saved).__name__ == type(original).__name__
    assert saved.tokenizer.get_vocab() == original.tokenizer.get_vocab()
    assert saved.chat_template == original.chat_template
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["calibration"]["modality"] == modality
    config = json.loads((out / "config.json").read_text())
    kept = config["quantization_config"]["ignore"]  # for vLLM and transformers to keep dense
    assert any(parts.part_of(name) == tower for name in kept)
    batch = load_multimodal_calibration(rows, out, samples=2, seq_len=512, batch_size=2).batches[0]
    architecture = getattr(
        transformers, json.loads((out / "config.json").read_text())["architectures"][0]
    )
    # compared in the stored dtype, kernel for kernel: dequantizing in float32 would round
    # differently from the weights our model holds
    reloaded = architecture.from_pretrained(out, attn_implementation="eager").eval()
    ours.set_attn_implementation("eager")
    assert reloaded.dtype == ours.dtype
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, ours(**batch).logits)

    # evaluate on the media before (our model) and after reload (the checkpoint's folder)
    ours.set_attn_implementation("sdpa")
    data = load_multimodal_calibration(
        rows, out, samples=4, seq_len=512, batch_size=2, shuffle=False
    )
    before = perplexity(ours, data).perplexity
    after = evaluate_model(out, rows, samples=4, batch_size=2, modality=modality).perplexity
    assert after == pytest.approx(before, rel=1e-4)


def test_towers_on_request(twins, drawn_rows: Path) -> None:
    folder = twins("llava-hf/llava-1.5-7b-hf")
    result = compress(CompressRequest(folder, drawn_rows, None, towers=True, **RUN))
    parts = {model_parts(result.model).part_of(r.name) for r in result.layers}
    assert parts == {"language model", "vision tower", "projector"}
    rows_of = {row.kind: row for row in result.stages[-1].coverage}
    # every weight of the tower but its patch embedding's convolution, which no method reads
    [conv] = [m for m in result.model.modules() if isinstance(m, torch.nn.Conv2d)]
    tower = rows_of["vision tower"]
    assert tower.total - tower.compressed == conv.weight.numel()
    assert tower.compressed > 0.8 * tower.total


def test_an_opaque_feature_method_streams_its_tower_in_through_the_sequential_pipeline(
    twins, drawn_rows: Path, tmp_path: Path
) -> None:
    """Recorded as one call (a fix ``attempt --fix`` offers), LLaVA's ``get_image_features``
    runs the vision tower and projector outside every module node of the graph: the trace
    names them, so the streamed sequential pipeline reads their weights in with the first
    subgraph and writes the bytes of the run that traces through the method."""
    folder = twins("llava-hf/llava-1.5-7b-hf")
    run = {**RUN, "samples": 2}
    opaque = compress(
        CompressRequest(
            folder,
            drawn_rows,
            tmp_path / "opaque",
            tracing_ignore=["LlavaModel.get_image_features"],
            **run,
        )
    )
    compress(CompressRequest(folder, drawn_rows, tmp_path / "traced", **run))
    assert opaque.pipeline == "sequential" and not opaque.fallbacks
    assert (tmp_path / "opaque" / "model.safetensors").read_bytes() == (
        tmp_path / "traced" / "model.safetensors"
    ).read_bytes()


def test_the_written_recipe_reproduces_an_image_calibrated_checkpoint(
    twins, drawn_rows: Path, tmp_path: Path
) -> None:
    """recipe.yaml records the data and its modality: compressing again from it gives the
    same bytes (Gemma 3's twin: the fastest of the six)."""
    folder = twins("google/gemma-3-4b-it")
    first, again = tmp_path / "first", tmp_path / "again"
    compress(CompressRequest(folder, drawn_rows, first, **RUN))
    compress(CompressRequest.from_recipe(first / "recipe.yaml", folder, again))
    assert (first / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    assert (first / "recipe.yaml").read_text() == (again / "recipe.yaml").read_text()
