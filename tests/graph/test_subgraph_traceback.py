"""A failure inside a subgraph's code names the model's own file and line."""

from __future__ import annotations

import inspect
import traceback

import pytest
import torch

from llmc_trace import trace_subgraphs


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _Model(torch.nn.Module):
    """Work between the layers, as a decoder stack's residual adds: it runs in the subgraphs'
    generated code, not in any module."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(), _Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shift = x.mean(dim=-1, keepdim=True)
        for layer in self.layers:
            x = layer(x) + shift
        return x


def test_a_failure_in_a_subgraph_names_the_model_line_that_made_the_operation() -> None:
    model = _Model()
    subgraphs = trace_subgraphs(model, {"x": torch.rand(2, 4)}, ["_Layer"])
    last = subgraphs[-1]
    inputs = {name: torch.rand(2, 4) for name in last.input_names}
    shift = next(name for name in last.input_names if "mean" in name)
    inputs[shift] = torch.rand(3, 1)  # a value of the wrong shape: the add fails
    with torch.no_grad(), pytest.raises(RuntimeError) as raised:
        last.forward(model, **inputs)
    formatted = "".join(traceback.format_exception(raised.value))
    lines, start = inspect.getsourcelines(_Model.forward)
    number = start + next(i for i, text in enumerate(lines) if "layer(x) + shift" in text)
    assert f'File "{__file__}", line {number}, in _Model.forward' in formatted
    assert "x = layer(x) + shift" in formatted
    # the generated statement is shown too (registered with linecache, as torch.fx does)
    assert f'File "<llmc-trace subgraph {last.index} #' in formatted
    assert "add_1 = layers_1 + mean" in formatted
