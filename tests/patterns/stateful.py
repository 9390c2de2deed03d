"""Patterns where execution order or object identity matters across sequential targets."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling

from tests.patterns.untraceable import Block


class InplaceScatter(nn.Module):
    """An in-place write with no users (based on modeling_llava.py: inputs_embeds[mask] = ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.project = nn.Linear(8, 8)
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, input_ids: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        x[input_ids == 3] = self.project(image_features)
        for layer in self.layers:
            x = layer(x)
        return x


class WriteAfterRead(nn.Module):
    """A write into a value after a target read it: the write must wait for that target."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1.0
        h = self.layers[0](x)
        x.mul_(3.0)
        return self.layers[1](x) + h


class OutputLayer(nn.Module):
    """A target returning a ModelOutput, read by attribute downstream."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self.block(x))


class ModelOutputChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([OutputLayer(), OutputLayer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x).last_hidden_state
        return x


class Recorder(nn.Module):
    """Writes its output into a shared dict and reads what the previous layer left there."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor, shared: dict) -> torch.Tensor:
        previous = shared.get("last", torch.zeros_like(x))
        out = self.block(x) + previous
        shared["last"] = out
        return out


class SharedState(nn.Module):
    """Layers sharing state by mutation (based on per-layer caches filled during forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Recorder(), Recorder(), Recorder()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared: dict = {}
        for layer in self.layers:
            x = layer(x, shared)
        return x + shared["last"]


class Encoder(nn.Module):
    """A leaf returning a ModelOutput (a vision tower)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> BaseModelOutputWithPooling:
        return BaseModelOutputWithPooling(last_hidden_state=self.proj(x))


class FieldAssignment(nn.Module):
    """A field set on a traced ModelOutput and read back as a list (based on
    modeling_smolvlm.py: ``image_outputs.pooler_output = [...]``, then ``torch.cat``)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, BaseModelOutputWithPooling]:
        out = self.encoder(x)
        out.pooler_output = [f.reshape(-1, 8) for f in out.last_hidden_state.split(1)]
        features = out.pooler_output
        if isinstance(features, list):
            features = torch.cat(features, dim=0)
        for layer in self.layers:
            x = layer(x) + features.sum()
        return x, out  # the updated output object itself, as SmolVLM returns it


@dataclass
class Case:
    model: nn.Module
    sample: dict[str, torch.Tensor]
    targets: list[str]


def cases() -> dict[str, Case]:
    torch.manual_seed(0)
    ids = torch.tensor([[1, 3, 5, 3, 2]])
    return {
        "inplace_scatter": Case(
            InplaceScatter(), {"input_ids": ids, "image_features": torch.randn(2, 8)}, ["Block"]
        ),
        "write_after_read": Case(WriteAfterRead(), {"x": torch.randn(1, 4, 8)}, ["Block"]),
        "model_output": Case(ModelOutputChain(), {"x": torch.randn(1, 4, 8)}, ["OutputLayer"]),
        "shared_state": Case(SharedState(), {"x": torch.randn(1, 4, 8)}, ["Recorder"]),
        "field_assignment": Case(FieldAssignment(), {"x": torch.randn(2, 4, 8)}, ["Block"]),
    }
