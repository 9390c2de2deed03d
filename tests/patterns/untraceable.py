"""Untraceable patterns distilled from real model code, one small module each.

Each class names the model file it was distilled from. The tests assert that tracing reports
the right kind, file, line, module path and origin chain for each.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from llmc_trace.diagnose.failure import TraceFailure, failure_from_exception
from llmc_trace.errors import TraceStopped
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph


def failure_of(model: nn.Module, sample: dict[str, Any], targets: list[str]) -> TraceFailure:
    """Trace ``model``, which must fail, and return the failure as llmc-trace reports it."""
    with pytest.raises(TraceStopped) as info:
        trace_graph(model, sample, TracingOptions(sequential_targets=tuple(targets)))
    return failure_from_exception(info.value)


class Block(nn.Module):
    """A stand-in decoder layer (the sequential target)."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x))


class Stack(nn.Module):
    """Two blocks after a ``prepare`` step; each pattern overrides ``prepare`` only."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width), Block(width)])

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.prepare(x, grid)
        for layer in self.layers:
            x = layer(x)
        return x


class Wrapper(nn.Module):
    """Puts a pattern at module path ``model``, as a causal-LM wrapper would."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.model = inner

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return self.model(x, grid)


class ValueBranch(Stack):
    """`if` on tensor values (based on modeling_qwen2_vl.py's image-token count check)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if grid.prod() > 4:
            x = x * 2
        return x


class ItemToPython(Stack):
    """`.item()` turned into a Python size (based on modeling_glm's indexer `min(topk, len)`)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        count = int(grid.max().item())
        return x[:, :count]


class LoopOverTensor(Stack):
    """A loop over grid rows (based on modeling_qwen2_vl.py's `for t, h, w in grid_thw`)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        for t, h, w in grid.tolist():
            x = x + t * h * w
        return x


class DataShape(Stack):
    """A branch on a shape that depends on data (based on boolean-mask gathers in llava)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        selected = x[x > 0]
        if selected.shape[0] > 3:
            x = x + 1
        return x


class ShapeBranch(Stack):
    """A branch on a sequence length: traceable, recorded as a guard (sliding-window models)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 4:
            x = x.flip(1)
        return x


class SelectionLength(Stack):
    """`len()` of a boolean-mask gather (based on llava's count of selected image features)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        count = len(x[x > 0])
        return x * count


class IntOfMax(Stack):
    """`int()` of a tensor reduction (based on modeling_qwen2_vl.py's `max_grid_size`)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return x[:, : int(grid.max())]


class TokenMembership(Stack):
    """`in` on a tensor (based on VLMs' `if image_token_id in input_ids`)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if 2 in grid:
            x = x + 1
        return x


class LoopOverSelection(Stack):
    """A loop over a boolean-mask gather (based on llava-next's per-image feature loop)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        for row in x[x.sum(-1) > 0]:
            x = x + row
        return x


class LegacyConstructor(Stack):
    """`torch.Tensor(value)` (based on older modeling code's legacy `torch.Tensor(...)`)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        offsets = torch.Tensor(grid.prod())
        return x + offsets.sum()


class PlainObjectArgument(Stack):
    """A Python object handed to a tensor method (based on helpers passing option objects)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return x.to(object())


class RescalesOwnWeights(Stack):
    """Weights divided in place by the forward (based on modeling_rwkv.py's _rescale_layers)."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            for index, layer in enumerate(self.layers):
                layer.proj.weight.div_(2**index)
        return x


class ForwardBranch(nn.Module):
    """An `if` on tensor data directly in the top-level forward, after the layers.

    Based on modeling_gemma4.py's `Gemma4ForConditionalGeneration.forward`, whose logits
    slicing depends on a shape comparison; no helper function holds it, and the forward calls
    the targets, so the opaque fix cannot take it.
    """

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width), Block(width)])

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        if grid.sum() > 4:
            x = x * 2
        return x


class ForwardLoop(Stack):
    """A loop over grid rows directly in a forward, between two targets, reading `self`.

    Based on modeling_qwen2_vl.py's `for t, h, w in grid_thw` loop.
    """

    scale = 0.5

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        for t, h, w in grid.tolist():
            x = x + t * h * w * self.scale
        return self.layers[1](x)


class ForwardTemporary(Stack):
    """Two `if` statements in a forward binding the same temporary, the second on tensor data.

    Based on modeling_switch_transformers.py's `SwitchTransformersBlock.forward`, whose
    float16 clamps each bind `clamp_value`: the first branch did not run, so the moved second
    statement must not be handed a `limit` that was never bound.
    """

    clamp_first = False

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        if self.clamp_first:
            limit = x.abs().max()
            x = torch.clamp(x, -limit, limit)
        if grid.sum() > 4:
            limit = grid.sum() * 0.1
            x = torch.clamp(x, -limit, limit)
        return self.layers[1](x)


class ForwardAssert(Stack):
    """An `assert` on tensor data in a forward (based on input checks in vision towers)."""

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](x)
        assert grid.min() >= 0, "grid sizes must not be negative"
        return self.layers[1](x)


class EarlyReturn(nn.Module):
    """A data-dependent early `return` in the top-level forward: what only a definition fixes.

    Based on models that skip their layers when a batch holds no tokens of a kind; which code
    runs after the `if` depends on the data, which one graph cannot express.
    """

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width), Block(width)])

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if grid.sum() == 0:
            return x
        for layer in self.layers:
            x = layer(x)
        return x


class BranchAroundLayer(Stack):
    """A target called only when the data says so: autowrapping the `if` would hide it."""

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if grid.sum() > 4:
            x = self.layers[0](x)
        return self.layers[1](x)


class NonesPerRow(Stack):
    """``modeling_unlimited_ocr.py``: a list of ``None`` sized by the batch, each row checked
    against ``None``. The trace records the list as an operation on the batch size, so the
    check sees a traced value, never ``None``, and takes the branch the replay cannot."""

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        extras = [None] * x.shape[0]
        rows = []
        for index in range(2):
            extra = extras[index]
            rows.append(x[index] if extra is None else x[index] + extra.sum())
        return torch.stack(rows)
