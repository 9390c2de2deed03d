"""Image tokens reach GPTQ's Hessians: the language layers' Hessians from an image
calibration through the sequential pipeline (traced on the first batch, fed batches of two
other image sizes after it) equal those an eager run of the whole model collects with plain
hooks on every batch, and differ from the captions' alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmc_trace import CompressRequest, compress
from llmc_trace.data.multimodal import load_multimodal_calibration
from llmc_trace.models.parts import model_parts
from llmc_trace.calibrate.hessians import HessianCollector
from tests.multimodal import load_twin

QWEN2_VL = "Qwen/Qwen2-VL-2B-Instruct"
# propagate off: every layer then sees the float model's inputs, as the eager run does
RUN = dict(samples=6, seq_len=512, batch_size=2, pipeline="sequential", propagate=False)


def _captured(monkeypatch: pytest.MonkeyPatch, request: CompressRequest) -> dict[str, torch.Tensor]:
    """Each target's Hessian as the compressor hands it to the solver."""
    seen: dict[str, torch.Tensor] = {}
    finish = HessianCollector.finish

    def keep(self, targets):  # type: ignore[no-untyped-def]
        handed = finish(self, targets)
        seen.update({name: entry.accumulator.H.clone() for name, entry in handed.items() if entry})
        return handed

    with monkeypatch.context() as patch:
        patch.setattr(HessianCollector, "finish", keep)
        compress(request)
    return seen


def _eager(
    folder: Path, batches: list[dict[str, torch.Tensor]], names: list[str]
) -> dict[str, torch.Tensor]:
    """2 XᵀX / n of every named layer's inputs over the real tokens, from hooks on the whole
    model run eagerly (no trace, no subgraphs)."""
    model = load_twin(folder)
    model.set_attn_implementation("sdpa")  # the kernel calibration runs
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = dict.fromkeys(names, 0)
    mask: list[torch.Tensor] = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def add(_: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            rows = args[0][mask[0].bool()].double()
            sums[name] = sums.get(name, 0) + rows.T @ rows
            counts[name] += rows.shape[0]

        return add

    handles = [model.get_submodule(name).register_forward_pre_hook(hook(name)) for name in names]
    with torch.no_grad():
        for batch in batches:
            mask[:] = [batch["attention_mask"]]
            model(**batch)
    for handle in handles:
        handle.remove()
    return {name: (2 * sums[name] / counts[name]).float() for name in names}


def test_image_tokens_reach_the_language_layers_hessians(
    twins, drawn_rows: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = twins(QWEN2_VL)
    images = _captured(monkeypatch, CompressRequest(folder, drawn_rows, None, **RUN))
    names = sorted(images)
    parts = model_parts(load_twin(folder))
    assert names and {parts.part_of(name) for name in names} == {"language model"}

    # the batches compress made (same rows, seed and sizes), run eagerly
    batches = load_multimodal_calibration(
        drawn_rows, folder, samples=6, seq_len=512, batch_size=2
    ).batches
    grids = {tuple(batch["image_grid_thw"].flatten().tolist()) for batch in batches}
    assert len(grids) == 3  # three image sizes: later batches are not the one traced on
    eager = _eager(folder, batches, names)
    for name in names:
        torch.testing.assert_close(images[name], eager[name], rtol=1e-4, atol=1e-5, msg=name)

    # the same captions without their images: other Hessians, by far more than rounding
    captions = _captured(
        monkeypatch,
        CompressRequest(folder, drawn_rows, None, modality="text", **{**RUN, "seq_len": 8}),
    )
    for name in names:
        gap = (images[name] - captions[name]).norm() / images[name].norm()
        assert gap > 0.05, name
