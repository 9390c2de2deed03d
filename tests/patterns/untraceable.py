"""Untraceable patterns distilled from real model code, one small module each.

Each class names the model file it was distilled from. The tests assert that tracing reports
the right kind, file, line, module path and origin chain for each.
"""

from __future__ import annotations

import torch
from torch import nn


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
