"""Batches of differently sized images replay through subgraphs traced on the first batch.

The pipelines trace once, on the first calibration batch, with the fixes `attempt --fix`
settles; every later batch must then run through the same subgraphs. The reference is the
twin's eager forward on each batch.
"""

from __future__ import annotations

import torch

from llmc_trace import trace_subgraphs
from llmc_trace.data import load_multimodal_calibration
from llmc_trace.graph.verify import replay
from tests.multimodal import load_twin


def test_qwen2_vl_batches_of_other_image_sizes_replay_exactly(twins, drawn_rows):
    folder = twins("Qwen/Qwen2-VL-2B-Instruct")
    calibration = load_multimodal_calibration(
        drawn_rows, folder, samples=6, seq_len=512, batch_size=2, shuffle=False
    )
    grids = {tuple(b["image_grid_thw"].flatten().tolist()) for b in calibration.batches}
    assert len(grids) == 3  # each batch holds other image sizes than the one traced on
    model = load_twin(folder)
    subgraphs = trace_subgraphs(model, calibration.batches[0])  # settles get_rope_index's fix
    with torch.no_grad():
        for batch in calibration.batches:
            torch.testing.assert_close(
                replay(model, subgraphs, batch).logits, model(**batch).logits
            )
