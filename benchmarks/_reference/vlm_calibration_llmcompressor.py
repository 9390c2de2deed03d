"""Calibrate a Qwen2-VL folder on image rows with llm-compressor 0.14, as its example does.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started by
``benchmarks/vlm_calibration.py`` in a fresh process; it imports nothing from llmc-trace. The
steps are those of llm-compressor's ``examples/multimodal_vision/qwen2_vl_example.py``: each row
laid out as a chat (the image as the user's turn, the caption as the assistant's answer: the
layout llmc-trace gives a ``{"image", "text"}`` row), its text rendered by the processor's chat
template and the row preprocessed alone (``padding=False``, ``max_length``, ``truncation``);
a ``data_collator`` that returns the single row's tensors; ``GPTQModifier(targets="Linear",
scheme="W4A16", ignore=["lm_head", "re:visual.*", "re:model.visual.*"])`` with
``sequential_targets=["Qwen2VLDecoderLayer"]``; ``save_pretrained(save_compressed=True)``.

Three departures, each so that both tools see the same samples offline:

* The processor is built from its parts. transformers 5's ``AutoProcessor`` for Qwen2-VL
  checks a video processor that needs torchvision, absent here; the image processor's Pillow
  backend, the tokenizer and the chat template are what image rows use, and the video part is
  left out (``_ImagesOnly``).
* Images are read from the rows' files, not through ``qwen_vl_utils.process_vision_info``
  (not installed); that function only resizes to multiples of 28 pixels, which the drawn
  images already are.
* ``oneshot`` gets a ``DataLoader`` over the preprocessed rows (batch 1, the example's
  collator, rows in the order given by ``--order``) instead of the dataset and the collator
  separately: its own sampler visits rows longest first (``shuffle_calibration_samples=False``)
  or at random (the default), and llmc-trace visits them in its seed's order.

Seconds cover loading, preprocessing, ``oneshot`` and saving, split into ``data``
(preprocessing), ``trace`` (``trace_subgraphs``, wrapped here) and ``calibrate`` (the rest of
``oneshot``), of which ``solves_s`` in GPTQ's ``quantize_weight`` (wrapped too); memory is the
resident high-water mark (VmHWM) over the whole process, with the resident set right after the
imports beside it. The input ids and a digest of the pixel values of every sample are
reported, so the caller can check they are the ones llmc-trace used, and how many image-token
positions reach the first decoder layer during calibration still holding the placeholder
token's embedding (``as_placeholder`` of ``image_positions``): those the vision tower's
features never replaced.

    python vlm_calibration_llmcompressor.py TWIN_DIR ROWS.jsonl OUT_DIR --order 3,0,2 --seq-len 256

Prints one line ``RESULT {json}``, or with ``error`` when it fails; ``environment`` and the load
averages before and after say what the run ran with (``benchmarks/_environment.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_rss.py, ...
from _environment import describe, load_average  # noqa: E402
from _rss import peak_rss_since_reset, resident_bytes  # noqa: E402
from _worker import failure_text  # noqa: E402

IGNORE = ["lm_head", "re:visual.*", "re:model.visual.*"]
SEQUENTIAL_TARGETS = ["Qwen2VLDecoderLayer"]


def build_processor(folder: Path) -> Any:
    """Qwen2-VL's processor from the parts image rows need (see the module docstring)."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor

    class _ImagesOnly(Qwen2VLProcessor):
        """Accepts no video processor: checking one's class needs torchvision."""

        def check_argument_for_proper_class(self, name: str, argument: Any) -> Any:
            if argument is None:
                return None
            return super().check_argument_for_proper_class(name, argument)

    template = folder / "chat_template.jinja"
    return _ImagesOnly(
        image_processor=AutoImageProcessor.from_pretrained(
            folder, backend="pil", local_files_only=True
        ),
        tokenizer=AutoTokenizer.from_pretrained(folder, local_files_only=True),
        video_processor=None,
        chat_template=template.read_text() if template.is_file() else None,
    )


def preprocess(processor: Any, rows: Path, order: list[int], seq_len: int) -> list[dict]:
    """Each row in ``order`` as the example preprocesses it: chat template, processor call."""
    from PIL import Image

    table = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
    samples = []
    for index in order:
        row = table[index]
        messages = [
            {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": row["text"]}]},
        ]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        with Image.open(rows.parent / row["image"]) as image:
            picture = image.convert("RGB")
        encoded = processor(
            text=[text], images=[picture], padding=False, max_length=seq_len, truncation=True
        )
        samples.append(dict(encoded))
    return samples


def data_collator(batch: list[dict]) -> dict:
    """The example's collator: one row, each value as a tensor."""
    import torch

    assert len(batch) == 1
    return {key: torch.tensor(value) for key, value in batch[0].items()}


def timed(pipeline: Any, gptq: Any, record: dict[str, Any]) -> None:
    """Wrap the sequential pipeline's ``trace_subgraphs`` (its seconds, when it ended, the
    subgraph count) and GPTQ's ``quantize_weight`` (the solves' seconds, summed), where the
    pipeline and the modifier look them up."""
    trace_subgraphs, quantize_weight = pipeline.trace_subgraphs, gptq.quantize_weight
    record["solves_s"] = 0.0

    def traced(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        subgraphs = trace_subgraphs(*args, **kwargs)
        record["traced_at"] = time.perf_counter()
        record["trace_s"] = record["traced_at"] - start
        record["subgraphs"] = len(subgraphs)
        return subgraphs

    def solved(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return quantize_weight(*args, **kwargs)
        finally:
            record["solves_s"] += time.perf_counter() - start

    pipeline.trace_subgraphs, gptq.quantize_weight = traced, solved


def watch_image_positions(model: Any, samples: list[dict], record: dict[str, Any]) -> None:
    """Count, over the calibration pass, the image-token positions at which the first decoder
    layer receives the placeholder token's own embedding: positions the vision features never
    reached. Batches run in ``samples``' order, calibration pass first."""
    import torch

    image_id = model.config.image_token_id
    placeholder = model.get_input_embeddings().weight[image_id].detach().clone()
    record["image_positions"] = record["as_placeholder"] = 0
    calls = iter(samples)

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        sample = next(calls, None)
        if sample is None:  # the propagation pass
            return
        hidden = args[0] if args else kwargs["hidden_states"]
        at_images = hidden[0, torch.tensor(sample["input_ids"][0]) == image_id]
        record["image_positions"] += at_images.shape[0]
        record["as_placeholder"] += int((at_images == placeholder).all(-1).sum())

    layer = model.model.language_model.layers[0]
    layer.register_forward_pre_hook(hook, with_kwargs=True)


def digest(values: Any) -> str:
    """A digest of float32 pixel values, to compare with the other tool's without moving them."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float32).tobytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("rows", type=Path, help='.jsonl of {"image": path, "text": caption}')
    parser.add_argument("out_dir")
    parser.add_argument("--order", required=True, help="row indices, comma-separated")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()

    import torch
    import transformers  # noqa: F401  (part of the baseline, as for llmc-trace)
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.gptq import base as gptq
    from llmcompressor.pipelines.sequential import pipeline
    from torch.utils.data import DataLoader
    from transformers import Qwen2VLForConditionalGeneration

    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"baseline_rss_bytes": resident_bytes()}
    result["environment"] = describe(["llmcompressor", "compressed-tensors"])
    result["load_before"] = load_average()
    record: dict[str, Any] = {}
    timed(pipeline, gptq, record)
    try:
        start = time.perf_counter()
        model = Qwen2VLForConditionalGeneration.from_pretrained(args.model_dir, dtype="auto")
        loaded = time.perf_counter()
        processor = build_processor(args.model_dir)
        order = [int(index) for index in args.order.split(",")]
        samples = preprocess(processor, args.rows, order, args.seq_len)
        dataset = Dataset.from_list(samples)
        prepared = time.perf_counter()
        watch_image_positions(model, samples, record)
        oneshot(
            model=model,
            processor=processor,
            dataset=DataLoader(dataset, batch_size=1, collate_fn=data_collator),
            recipe=GPTQModifier(targets="Linear", scheme="W4A16", ignore=IGNORE),
            max_seq_length=args.seq_len,
            num_calibration_samples=len(samples),
            sequential_targets=SEQUENTIAL_TARGETS,
        )
        calibrated = time.perf_counter()
        model.save_pretrained(args.out_dir, save_compressed=True)
        end = time.perf_counter()
        result["seconds"] = end - start
        result["phases_s"] = {
            "load": loaded - start,
            "data": prepared - loaded,
            "trace": record["trace_s"],
            "calibrate": calibrated - record["traced_at"],
            "write": end - calibrated,
        }
        result["solves_s"] = record["solves_s"]
        result["subgraphs"] = record["subgraphs"]
        result["samples"] = len(samples)
        result["tokens"] = sum(len(sample["input_ids"][0]) for sample in samples)
        result["input_ids"] = [sample["input_ids"][0] for sample in samples]
        result["pixel_digests"] = [digest(sample["pixel_values"]) for sample in samples]
        result["image_positions"] = record["image_positions"]
        result["as_placeholder"] = record["as_placeholder"]
        result["peak_rss_bytes"] = peak_rss_since_reset()
        result["load_after"] = load_average()
    except Exception as err:  # a failed reference run is a result to report, not a crash
        result["error"] = failure_text(err)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
