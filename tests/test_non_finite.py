"""The NaN and inf checks below the command line: the one reduction every check uses, against
``torch.isfinite`` as the reference, and the places a Python caller meets them (a model
loaded whole, the checkpoint writer, a raw token array, a HessianCollector)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from llmc_trace.checkpoint import writer as writer_module
from llmc_trace.checkpoint.writer import CheckpointWriter
from llmc_trace.core.finite import non_finite
from llmc_trace.errors import BadInputError, DataError, NonFiniteError
from llmc_trace.evaluate import perplexity
from llmc_trace.layers.linear import as_linear
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.calibrate.hessians import HessianCollector
from tests.conftest import tiny_llama

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("injected", [(), ("nan",), ("inf", "-inf"), ("nan", "inf", "nan")])
def test_non_finite_agrees_with_isfinite(dtype: torch.dtype, injected: tuple[str, ...]) -> None:
    values = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    for position, word in enumerate(injected):
        values[position, 7 * position] = float(word)
    tensor = values.to(dtype)
    wide = tensor.to(torch.float32)  # the reference: isfinite on float32 (float8 has no kernel)
    found = non_finite(tensor)
    assert (found is None) == bool(torch.isfinite(wide).all())
    if found is not None:
        counts = {
            "NaN": int(wide.isnan().sum()),
            "+inf": int(wide.isposinf().sum()),
            "-inf": int(wide.isneginf().sum()),
        }
        expected = " and ".join(f"{n:,} {kind}" for kind, n in counts.items() if n)
        assert found == f"{expected} among 3,000 values"


def test_integers_and_empty_tensors_are_finite() -> None:
    assert non_finite(torch.tensor([-5, 7])) is None
    assert non_finite(torch.empty(0, 4)) is None


def test_a_model_loaded_whole_refuses_a_nan_weight(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Compressing in memory loads the model through transformers, not the weight store: the
    weights are checked there too."""
    folder, data = saved_llama
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tensors = load_file(broken / "model.safetensors")
    tensors["model.norm.weight"][17] = float("nan")
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadInputError, match=r"model\.norm\.weight holds 1 NaN among 128 values"):
        compress(CompressRequest(broken, data, samples=2, seq_len=32))


def test_the_writer_refuses_a_non_finite_tensor_and_leaves_nothing(tmp_path: Path) -> None:
    model = tiny_llama(layers=1)
    out = tmp_path / "out"
    with pytest.raises(NonFiniteError, match=r"model\.norm\.weight holds 1 -inf") as raised:
        with CheckpointWriter(out, model, {}, {}, dtype=torch.float32) as writer:
            for key, value in model.state_dict().items():
                if key == "model.norm.weight":
                    value = value.clone()
                    value[0] = float("-inf")
                writer.put(key, value)
    assert raised.value.location == "model.norm.weight"
    assert not list(tmp_path.iterdir())


def test_a_writer_that_fails_while_opening_removes_its_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise TypeError("a shard size of the wrong kind")

    monkeypatch.setattr(writer_module, "ShardedSafetensors", refuse)
    with pytest.raises(TypeError):
        CheckpointWriter(tmp_path / "out", tiny_llama(layers=1), {}, {}, dtype=torch.float32)
    assert not list(tmp_path.iterdir())


def test_perplexity_refuses_ids_outside_the_embedding_table() -> None:
    model = tiny_llama(layers=1)  # 128 rows
    for ids in (np.full((2, 8), 128), np.full((2, 8), -5)):
        with pytest.raises(DataError, match=r"the token array holds token ids from .* \[0, 128\)"):
            perplexity(model, ids)


def test_a_layer_whose_inputs_hold_nan_is_named_with_its_subgraph() -> None:
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    x[1, 2, 3] = float("nan")
    ones = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(NonFiniteError, match=r"inputs of block\.proj \(subgraph 3\) hold 1 NaN"):
        observed(x, ones)
    # a padding token is no input: a NaN where the mask is 0 never reaches the Hessian
    padded = ones.clone()
    padded[1, 2] = 0
    assert torch.isfinite(observed(x, padded)).all()
    with pytest.raises(NonFiniteError, match=r"Hessian of block\.proj \(subgraph 3\) overflowed"):
        observed(torch.full((2, 5, 8), 1e30), ones)


def observed(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The Hessian a collector builds for one linear layer of subgraph 3 run on ``x``."""
    layer = torch.nn.Linear(8, 4)
    collector = HessianCollector()
    targets = [("block.proj", as_linear(layer))]
    collector.start(targets, all_tokens=True, subgraph=3)
    collector.see_batch({"attention_mask": mask})
    with torch.no_grad():
        layer(x)
    hessian = collector.finish(targets)["block.proj"]
    assert hessian is not None
    return hessian.accumulator.H
