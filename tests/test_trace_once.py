"""One run, one trace: attempt and compress trace the full-size model once.

Every tracing goes through ``LlmcTracer.trace_model``; counting its calls by the model they
trace shows whether a command re-traced the model it works on. The twin is its own model,
traced once for its own proof.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from llmc_trace.attempt.prove import attempt_trace
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.tracing.tracer import LlmcTracer


@pytest.fixture
def traced_models(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """Every model traced while the test runs, in order."""
    seen: list[torch.nn.Module] = []
    original = LlmcTracer.trace_model

    def counting(self: LlmcTracer, model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        seen.append(model)
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(LlmcTracer, "trace_model", counting)
    return seen


def hidden_size(model: torch.nn.Module) -> int:
    return model.config.get_text_config().hidden_size


def test_attempt_with_fix_that_succeeds_at_once_traces_the_model_once(
    traced_models: list[torch.nn.Module],
) -> None:
    report = attempt_trace("Qwen/Qwen3-0.6B", fix=True)
    assert report.ok and not report.fixes
    full = report.traced_model.model
    assert [m for m in traced_models if m is full] == [full]
    twins = [m for m in traced_models if m is not full]
    assert len(twins) == 1 and hidden_size(twins[0]) < hidden_size(full)


def test_compress_traces_the_model_it_calibrates_once(
    traced_models: list[torch.nn.Module], saved_llama: tuple[Path, Path]
) -> None:
    folder, data = saved_llama
    result = compress(CompressRequest(folder, dataset=data, samples=4, seq_len=32))
    assert result.pipeline == "sequential"
    assert [m for m in traced_models if m is result.model] == [result.model]
    # the twin's own trace proves the trace, and the plan reuses it: nothing else is traced
    assert len([m for m in traced_models if m is not result.model]) == 1
