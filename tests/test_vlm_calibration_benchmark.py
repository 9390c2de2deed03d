"""``benchmarks/vlm_calibration.py``'s checkpoint comparison: the two tools name Qwen2-VL's
language model differently on disk, and the agreement must still pair every module."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from llmc_trace.checkpoint.pack import pack_to_int32

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vlm_calibration import agreement, quantized  # noqa: E402


def write_checkpoint(folder: Path, prefix: str, q: torch.Tensor, scale: torch.Tensor) -> Path:
    """A one-Linear pack-quantized W4A16 checkpoint with the module under ``prefix``."""
    folder.mkdir()
    weights = {"num_bits": 4, "group_size": q.shape[1] // scale.shape[1]}
    config = {"quantization_config": {"config_groups": {"group_0": {"weights": weights}}}}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {
            f"{prefix}.weight_packed": pack_to_int32(q, 4),
            f"{prefix}.weight_scale": scale.to(torch.bfloat16),
            f"{prefix}.weight_shape": torch.tensor(q.shape),
        },
        folder / "model.safetensors",
    )
    return folder


def test_agreement_pairs_both_layouts_and_counts_differences(tmp_path: Path) -> None:
    q = torch.randint(-8, 8, (4, 256), generator=torch.Generator().manual_seed(0))
    scale = torch.tensor([[0.5, 0.25]] * 4)
    other = q.clone()
    other[1, 200] += 2 if q[1, 200] < 6 else -2  # two steps, in the group of scale 0.25
    ours = write_checkpoint(
        tmp_path / "ours", "model.language_model.layers.0.mlp.up_proj", q, scale
    )
    theirs = write_checkpoint(tmp_path / "theirs", "model.layers.0.mlp.up_proj", other, scale)

    figures = agreement(quantized(ours), quantized(theirs))

    assert figures["only_in_one"] == []
    up = figures["layers.0.mlp.up_proj"]
    assert (up["same"], up["count"], up["steps"]) == (q.numel() - 1, q.numel(), 2)
    assert up["weight"] == 2 * 0.25
    assert up["same_scales"] == up["scales"] == 8
    assert figures["all"]["same"] == q.numel() - 1
