"""Fixtures for the render tests: Llama-like config folders, built-in deep models, traces.

Traces are built from configs on ``meta`` (cheap even at 70B size) and shared per session, so
each view test only pays for drawing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmc_trace.traced.model import TracedModel, trace_source
from tests.patterns import untraceable as patterns
from tests.render.helpers import failing_trace, llama_config


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-layer Llama config folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    llama_config(3).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def llama70b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-3-70B's shape: 80 layers of width 8192 (built on meta, so it costs no memory)."""
    folder = tmp_path_factory.mktemp("llama-70b")
    llama_config(80, hidden=8192).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def llama_trace(llama_dir: Path) -> TracedModel:
    return trace_source(str(llama_dir))


@pytest.fixture(scope="session")
def llama70b_trace() -> TracedModel:
    """The built-in meta-llama/Llama-3.1-70B on meta: 80 identical decoder layers."""
    return trace_source("meta-llama/Llama-3.1-70B")


@pytest.fixture(scope="session")
def deepseek_v3_trace() -> TracedModel:
    """The built-in deepseek-ai/DeepSeek-V3 on meta: 3 dense layers, then 58 MoE layers."""
    return trace_source("deepseek-ai/DeepSeek-V3")


@pytest.fixture(scope="session")
def value_branch_trace() -> TracedModel:
    return failing_trace(patterns.ValueBranch)
