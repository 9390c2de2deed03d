"""Fixtures for the compression tests: seeded correlated inputs and real refmodel activations."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from _compress_data import LayerInputs, capture_inputs, make_correlated_inputs
from refmodel import FOLDER as REFMODEL


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Run each test module here on one CPU thread, restoring the setting afterwards.

    The column sweeps are thousands of tiny ops. On a shared 2-core machine, two OpenMP threads
    stall on every op whenever another process holds a core: a refmodel layer's GPTQ took
    1.9 s instead of 0.02 s. One thread keeps the suite's time independent of the neighbours.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def correlated_inputs() -> Callable[[int, int, int], torch.Tensor]:
    return make_correlated_inputs


@pytest.fixture(scope="session")
def refmodel(refmodel_dir) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(refmodel_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def down_proj(refmodel: torch.nn.Module) -> LayerInputs:
    """`model.layers.2.mlp.down_proj`: 768 -> 256, inputs with outlier channels (SwiGLU)."""
    name = "model.layers.2.mlp.down_proj"
    calib = np.load(REFMODEL / "calib.npy")[:8]
    evaluation = np.load(REFMODEL / "eval.npy")[:4]
    return LayerInputs(
        name,
        refmodel.get_submodule(name).weight.detach().clone(),
        capture_inputs(refmodel, name, calib),
        capture_inputs(refmodel, name, evaluation),
    )
