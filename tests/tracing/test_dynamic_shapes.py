"""A result's shape is data-dependent only where a data-dependent size really reaches it.

Each pattern takes image rows whose count depends on data (``x[mask]``, as vision-language
models select their image features) and merges them back into a tensor of fixed shape, then
asks a question of the merged shape, as Qwen2.5-VL asks ``position_ids.shape[0] == 4`` of
positions computed from its merged embeddings (modeling_qwen2_5_vl.py). Merges must trace
and replay like eager; results whose shape truly follows the data must still be refused.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import fx

from llmc_trace.attempt.prove import trace_subgraphs
from llmc_trace.graph.verify import verify_subgraphs
from llmc_trace.models.build import build_meta_model, build_twin
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import resolve_model
from llmc_trace.traced.model import trace_model
from llmc_trace.traced.twin import verify_on_sample
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.patterns import untraceable as patterns

WIDTH = 8
IMAGE = 3  # the placeholder id: rows of ``x`` at these positions are image rows


def image_rows(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows at image positions (data-dependent count) and those positions."""
    mask = ids[0] == IMAGE  # (S,)
    return x[0][mask], mask.nonzero().squeeze(-1)  # (K, D), (K,)


def masked_scatter(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, _ = image_rows(x, ids)
    mask = (ids == IMAGE).unsqueeze(-1).expand_as(x)
    return x.masked_scatter(mask, torch.tanh(rows))


def index_put(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, positions = image_rows(x, ids)
    return x[0].index_put((positions,), torch.tanh(rows)).unsqueeze(0)


def setitem(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, positions = image_rows(x, ids)
    merged = x[0].clone()
    merged[positions] = torch.tanh(rows)
    return merged.unsqueeze(0)


def scatter(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, positions = image_rows(x, ids)
    index = positions[:, None].expand(-1, x.shape[-1])  # (K, D)
    return x[0].scatter(0, index, torch.tanh(rows)).unsqueeze(0)


def index_add(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, positions = image_rows(x, ids)
    return x[0].index_add(0, positions, rows * 2).unsqueeze(0)


def selected_rows(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, _ = image_rows(x, ids)  # boolean indexing: K rows
    return rows.unsqueeze(0)


def nonzero_rows(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    _, positions = image_rows(x, ids)
    return x[:, positions]  # as many rows as nonzero found


class Merge(patterns.Stack):
    """Rows selected by data, merged back; then an ``if`` on the merged shape."""

    def __init__(self, merge: Any) -> None:
        super().__init__(WIDTH)
        self.merge = merge

    def prepare(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        merged = self.merge(x, grid)
        if merged.shape[1] == x.shape[1]:  # a question on the merged shape
            merged = merged * 2
        return merged


def sample() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.tensor([[1, IMAGE, IMAGE, 5, IMAGE, 7]])
    return {"x": torch.randn(1, 6, WIDTH, generator=generator), "grid": ids}


def merge_node(graph: fx.Graph, name: str) -> fx.Node:
    return next(n for n in graph.nodes if n.op != "placeholder" and name in str(n.target))


@pytest.mark.parametrize(
    ("merge", "op"),
    [
        (masked_scatter, "masked_scatter"),
        (index_put, "index_put"),
        (setitem, "setitem"),
        (scatter, "scatter"),
        (index_add, "index_add"),
    ],
)
def test_merging_data_dependent_rows_keeps_a_static_shape(merge: Any, op: str) -> None:
    model = patterns.Wrapper(Merge(merge)).eval()
    inputs = sample()
    trace = trace_graph(model, inputs, TracingOptions(sequential_targets=("Block",)))
    node = merge_node(trace.graph, op)
    assert node.meta["shape_static"], f"{op}'s result took the selected rows' data-dependent size"
    rows = merge_node(trace.graph, "tanh" if op != "index_add" else "mul")
    assert not rows.meta["shape_static"]  # the rows themselves still follow the data
    subgraphs = trace_subgraphs(model, inputs, ["Block"], fix=False)
    verification = verify_subgraphs(model, subgraphs, inputs, ["x", "grid"])
    assert verification.ok, verification.problems


@pytest.mark.parametrize("select", [selected_rows, nonzero_rows])
def test_a_shape_that_follows_the_data_is_still_refused(select: Any) -> None:
    model = patterns.Wrapper(Merge(select)).eval()
    failure = patterns.failure_of(model, sample(), ["Block"])
    assert failure.kind == "data_dependent_shape"
    assert failure.location is not None and "merged.shape[1]" in failure.location.code


def test_qwen2_5_vl_image_without_mm_token_type_ids_traces_and_verifies_without_a_fix() -> None:
    """The batch a processor without ``mm_token_type_ids`` returns (issue 38): the rope index
    then comes from the merged embeddings' shape, which no longer reads as data-dependent."""
    source = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct")
    for model in (build_meta_model(source), build_twin(source)):
        inputs = make_sample(model.config, "image", SampleOptions())
        del inputs["mm_token_type_ids"]
        traced = trace_model(model, inputs, TracingOptions.parse(model, []), name=source.name)
        assert traced.failure is None, traced.failure
    check = verify_on_sample(traced)  # the twin, against its own eager forward
    assert check.ok, check.verification.problems


def five_unknown_dims(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    rows, _ = image_rows(x, ids)  # (K, D)
    # meta cannot reshape the sentinel row count, so every dimension of the 5-D result is
    # unknown; its sentinel shape then holds more elements than one tensor may
    blocks = rows.reshape(3, 2, 2, 2, 1) * 2
    return x + blocks.sum()


def test_a_value_too_large_to_move_is_taken_as_data_dependent() -> None:
    """DeepSeek-V2's attention, traced into, made a 5-D value of unknown sizes: moving all five
    to their sentinels overflowed the tensor size, which stopped the trace; such a value is
    now what an unknown answer stands for, data-dependent, and the trace goes on."""
    model = patterns.Wrapper(Merge(five_unknown_dims)).eval()
    inputs = sample()
    trace = trace_graph(model, inputs, TracingOptions(sequential_targets=("Block",)))
    assert not merge_node(trace.graph, "mul").meta["shape_static"]
    subgraphs = trace_subgraphs(model, inputs, ["Block"], fix=False)
    verification = verify_subgraphs(model, subgraphs, inputs, ["x", "grid"])
    assert verification.ok, verification.problems
