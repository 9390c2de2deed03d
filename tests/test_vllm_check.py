"""The vLLM serving check's own logic (``benchmarks/vllm_serving.py``), without vLLM.

vLLM itself runs in CI's serving step, where the tampered checkpoints must fail; these tests
pin down what the check decides from what vLLM says, so a change to it cannot quietly turn a
refusal into a pass.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import (
    pack_to_int32,
    unpack_from_int32,
)
from safetensors.torch import load_file, save_file

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_serving.py"
WORKER = PATH.parent / "_reference" / "serve_vllm.py"


@pytest.fixture(scope="module")
def serving():  # noqa: ANN201 - the benchmark module, loaded from its file
    spec = importlib.util.spec_from_file_location("vllm_serving", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_serving"] = module
    spec.loader.exec_module(module)
    return module


def test_reversed_packing_keeps_shapes_and_scrambles_every_group(serving) -> None:  # noqa: ANN001
    values = torch.randint(-8, 8, (4, 64), dtype=torch.int8)
    packed = pack_to_int32(values, 4)
    reversed_packed = serving.reverse_nibbles(packed)
    assert reversed_packed.shape == packed.shape and reversed_packed.dtype == torch.int32
    torch.testing.assert_close(serving.reverse_nibbles(reversed_packed), packed)
    unpacked = unpack_from_int32(reversed_packed, 4, torch.Size([4, 64]))
    expected = values.view(4, 8, 8).flip(-1).reshape(4, 64)  # each int32's eight reversed
    torch.testing.assert_close(unpacked, expected)


def test_a_renamed_tensor_is_the_only_change(serving, tmp_path: Path) -> None:  # noqa: ANN001
    source = tmp_path / "source"
    source.mkdir()
    tensors = {
        "a.weight_scale": torch.ones(2),
        "a.weight_packed": torch.zeros(2, dtype=torch.int32),
    }
    save_file(tensors, source / "model.safetensors")
    serving.tamper(source, tmp_path / "out", "rename")
    after = load_file(tmp_path / "out" / "model.safetensors")
    assert sorted(after) == ["a.weight_packed", "a.weight_scales"]


def test_what_counts_as_a_pass(serving) -> None:  # noqa: ANN001
    case, tampered = serving.CASES[1], serving.CASES[-1]
    assert serving.Row(case, verdict="agrees").passed
    assert serving.Row(case, verdict="no kernel here; reference agrees").passed
    assert not serving.Row(case, verdict="DISAGREES").passed
    assert not serving.Row(case, verdict="REFUSED").passed
    assert serving.Row(tampered, verdict="DISAGREES").passed  # expected to fail, and did
    assert not serving.Row(tampered, verdict="agrees").passed  # the check missed it


def test_reasons_are_read_from_the_worker_log(serving) -> None:  # noqa: ANN001
    log = (
        "(EngineCore pid=1) ERROR [core.py:1] EngineCore failed to start.\n"
        "(EngineCore pid=1) ERROR [core.py:2] ValueError: Failed to find a kernel that can "
        "implement the WNA16 linear layer. Reasons:\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert serving.no_kernel_reason(log).startswith("ValueError: Failed to find a kernel")
    assert serving.root_cause(log, "fallback").startswith("ValueError: Failed to find a kernel")
    refusal = "ERROR [x.py:3] ValueError: Following weights were not initialized: ['a']\n"
    assert serving.no_kernel_reason(refusal) is None
    assert serving.root_cause(refusal, "fallback").startswith("ValueError: Following weights")
    # the worker's own RESULT line is not vLLM's log: the fallback (its error) is used
    result = 'RESULT {"ok": false, "error": "ValueError: no module named \'x\'"}\n'
    assert serving.root_cause(result, "ValueError: no module") == "ValueError: no module"


TORCHVISION_LOG = (
    "ERROR [registry.py:1120] Traceback (most recent call last):\n"
    'ERROR [registry.py:1120]   File "/v/lib/python3.11/site-packages/vllm/model_executor/'
    'models/registry.py", line 1590, in _run\n'
    'ERROR [registry.py:1120]   File "/v/lib/python3.11/site-packages/vllm/model_executor/'
    'models/llava.py", line 61, in <module>\n'
    'ERROR [registry.py:1120]   File "/v/lib/python3.11/site-packages/vllm/model_executor/'
    'models/pixtral.py", line 19, in <module>\n'
    'ERROR [registry.py:1120]   File "/v/lib/python3.11/site-packages/transformers/models/'
    'pixtral/image_processing_pixtral.py", line 19, in <module>\n'
    "ERROR [registry.py:1120] ModuleNotFoundError: No module named 'torchvision'\n"
)
CLIP_LOG = (
    "ValueError: There is no module or parameter named 'vision_tower.embeddings' in "
    "LlavaForConditionalGeneration. The available parameters belonging to vision_tower ...\n"
)


def test_missing_pieces_are_named_from_the_worker_log(serving) -> None:  # noqa: ANN001
    torchvision = serving.missing_piece(TORCHVISION_LOG)
    assert torchvision.stand_in == "pillow-processors"
    assert torchvision.reason == (
        "vllm/model_executor/models/llava.py imports vllm/model_executor/models/pixtral.py "
        "imports transformers/models/pixtral/image_processing_pixtral.py: "
        "No module named 'torchvision'"
    )
    clip = serving.missing_piece(CLIP_LOG)
    assert clip.stand_in == "clip-names"
    assert clip.reason.endswith("named 'vision_tower.embeddings' in LlavaForConditionalGeneration")
    kernel = (
        'File "/v/site-packages/vllm/.../schemes/compressed_tensors_wNa16.py", line 9\n'
        "ValueError: Failed to find a kernel that can implement the WNA16 linear layer.\n"
    )
    assert serving.missing_piece(kernel).stand_in == "reference-kernel"
    # the stand-in replaces the weight-only kernel alone: another scheme's missing kernel is
    # a refusal, found without a second start
    mxfp4 = (
        'File "/v/site-packages/vllm/.../schemes/compressed_tensors_w4a4_mxfp4.py", line 41\n'
        "ValueError: Failed to find a kernel that can implement the MXFP4 linear layer.\n"
    )
    assert serving.missing_piece(mxfp4) is None
    # a tampered name is a refusal, in the tower as anywhere else
    for name in ("vision_tower.vision_model.encoder.fc1.weights", "layers.0.o_proj.weight_scales"):
        refusal = f"ValueError: There is no module or parameter named '{name}' in Llava\n"
        assert serving.missing_piece(refusal) is None


def test_stand_ins_are_added_one_missing_piece_at_a_time(serving, monkeypatch, tmp_path) -> None:  # noqa: ANN001
    calls: list[list[str]] = []

    def serve(folder, subject, stand_ins):  # noqa: ANN001, ANN202 - vLLM's answers, in turn
        calls.append(stand_ins)
        logs = {0: TORCHVISION_LOG, 1: CLIP_LOG}
        if len(stand_ins) in logs:
            return {"ok": False, "error": "ValueError: engine failed"}, logs[len(stand_ins)]
        ok = {"ok": True, "perplexity": 10.005, "load_s": 1.0, "tokens_per_s": 9.0}
        return ok, ""

    monkeypatch.setattr(serving, "serve", serve)
    row = serving.Row(serving.CASES[1], ours=10.0)
    found = serving.judge(row, tmp_path, None, 1e-3, ())
    assert calls == [[], ["pillow-processors"], ["pillow-processors", "clip-names"]]
    assert [piece.stand_in for piece in found] == ["pillow-processors", "clip-names"]
    assert row.verdict == "no torchvision here, CLIP names mapped; reference agrees"
    assert row.passed and "No module named 'torchvision'" in row.detail
    # a piece already stood in for that vLLM still names is a refusal, not a loop
    calls.clear()
    row = serving.Row(serving.CASES[1], ours=10.0)
    serving.judge(row, tmp_path, None, 1e-3, (found[0],))
    assert calls == [["pillow-processors"], ["pillow-processors", "clip-names"]]
    assert "vision_tower.embeddings" in row.detail and "torchvision" not in row.detail
    monkeypatch.setattr(serving, "serve", lambda *_: ({"ok": False, "error": "x"}, CLIP_LOG))
    serving.judge(row, tmp_path, None, 1e-3, found)
    assert row.verdict == "REFUSED" and not row.passed


def test_media_rows_are_ours_with_their_images(serving, twins, drawn_rows, tmp_path) -> None:  # noqa: ANN001
    import json

    import numpy as np
    from PIL import Image

    from llmc_trace.data.rows import RowReader, detect_modality
    from llmc_trace.data.tables import read_text_table
    from llmc_trace.evaluate.run import evaluate_model

    folder = twins("llava-hf/llava-1.5-7b-hf")
    count = serving.write_media_rows(folder, drawn_rows, 3, tmp_path / "rows.json")
    written = json.loads((tmp_path / "rows.json").read_text())
    spec = importlib.util.spec_from_file_location("serve_vllm", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)  # imports vLLM only where it serves
    rows, placeholders = worker.read_rows(str(tmp_path / "rows.json"), count)
    assert count == len(rows) == 3 and rows == written["rows"]
    table = read_text_table(drawn_rows, "jsonl", "rows")
    reader = RowReader(table, detect_modality(table), base=drawn_rows.parent, target_rate=None)
    for index, row in enumerate(rows):
        (media_row,) = reader.read(index)
        (image,) = media_row.images
        (path,) = row["images"]
        assert np.array_equal(np.asarray(Image.open(path)), np.asarray(image))
        collapsed = worker.collapse_placeholders(row["token_ids"], placeholders)
        assert [t in placeholders for t in collapsed].count(True) == 1  # one marker per image
        assert [t for t in collapsed if t not in placeholders] == [
            t for t in row["token_ids"] if t not in placeholders
        ]
    # the rows score what evaluate scores: every token after the first but the placeholders
    scored = sum(sum(t not in placeholders for t in row["token_ids"][1:]) for row in rows)
    assert evaluate_model(folder, drawn_rows, samples=3).num_tokens == scored


def test_the_reference_kernel_unpacks_every_width_as_compressed_tensors_packs_it() -> None:
    spec = importlib.util.spec_from_file_location("serve_vllm", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    for bits in range(2, 9):
        values = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (8, 96), dtype=torch.int8)
        for dim in (0, 1):
            packed = pack_to_int32(values, bits, packed_dim=dim)
            unpacked = worker.unpack_dense(packed, bits, values.shape, dim)
            assert torch.equal(unpacked.to(torch.int8), values), (bits, dim)
