"""Each untraceable pattern is reported at its own line, module path, kind and origin."""

from __future__ import annotations

import inspect

import pytest
import torch

from llmc_trace.diagnose.failure import KINDS
from llmc_trace.graph.verify import replay
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.patterns import untraceable as patterns


def line_of(cls: type, text: str) -> int:
    """Line number (in the pattern file) of the first line of ``cls`` containing ``text``."""
    lines, start = inspect.getsourcelines(cls)
    body = next(i for i, line in enumerate(lines) if "def prepare" in line)
    return start + next(i for i, line in enumerate(lines) if i > body and text in line)


def fail(cls: type) -> object:
    model = patterns.Wrapper(cls()).eval()
    sample = {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 2]])}
    return patterns.failure_of(model, sample, ["Block"])


@pytest.mark.parametrize(
    ("cls", "kind", "text", "origin"),
    [
        (patterns.ValueBranch, "control_flow", "if grid.prod()", ["grid", "prod", "gt", "bool"]),
        (
            patterns.ItemToPython,
            "tensor_to_python",
            "int(grid.max()",
            ["grid", "max", "item", "int"],
        ),
        (patterns.LoopOverTensor, "tensor_to_python", "for t, h, w", ["grid", "tolist", "iter"]),
        (
            patterns.DataShape,
            "data_dependent_shape",
            "if selected.shape",
            ["x", "getitem", "size", "getitem", "gt", "bool"],
        ),
        (patterns.SelectionLength, "len", "count = len(", ["x", "getitem", "len"]),
        (patterns.IntOfMax, "python_number", "int(grid.max())", ["grid", "max", "int"]),
        (patterns.TokenMembership, "membership", "if 2 in grid", ["grid", "contains"]),
        (patterns.LoopOverSelection, "iteration", "for row in", ["x", "getitem", "iter"]),
        (patterns.LegacyConstructor, "constructor", "torch.Tensor(grid.prod())", []),
        (patterns.PlainObjectArgument, "unsupported_argument", "x.to(object())", []),
        (
            patterns.RescalesOwnWeights,
            "weight_mutation",
            "layer.proj.weight.div_(",
            ["model.layers.0.proj.weight", "div_"],
        ),
    ],
)
def test_failure_is_located_and_classified(
    cls: type, kind: str, text: str, origin: list[str]
) -> None:
    failure = fail(cls)
    assert failure.kind == kind
    assert failure.location is not None
    assert failure.location.abs_file == inspect.getsourcefile(cls)
    assert failure.location.line == line_of(cls, text)
    assert failure.location.function == f"{cls.__name__}.prepare"
    assert (failure.module_path, failure.module_class) == ("model", cls.__name__)
    assert failure.module_stack == [("model", cls.__name__)]
    assert failure.origin == origin


def test_shape_branch_traces_and_records_a_guard() -> None:
    model = patterns.Wrapper(patterns.ShapeBranch()).eval()
    sample = {"x": torch.randn(1, 6, 8), "grid": torch.tensor([[1, 2, 2]])}
    trace = trace_graph(model, sample, TracingOptions(sequential_targets=("Block",)))
    [guard] = trace.guards
    assert guard.question == "bool" and guard.expected is True
    assert guard.location is not None
    assert guard.location.line == line_of(patterns.ShapeBranch, "if x.shape[1] > 4")


def test_every_kind_is_tested() -> None:
    """Each kind in KINDS has a hand-written module above that fails in exactly that way."""
    parameters = test_failure_is_located_and_classified.pytestmark[0].args[1]
    tested = {kind for _, kind, _, _ in parameters}
    # any other exception is the catch-all; a replay's failure has its own test below
    assert set(KINDS) - tested == {"error", "replay"}


def test_a_replay_that_fails_where_eager_runs_is_located_and_fixed() -> None:
    """A trace that holds but replays into a value the trace fixed (a list of ``None`` sized by
    the batch) is located at the model's line and fixed by the search like a trace failure."""
    from llmc_trace.traced.settle import settle
    from llmc_trace.traced.model import trace_model
    from llmc_trace.traced.twin import verify_on_sample
    from llmc_trace.tracing.options import TracingOptions

    model = patterns.Wrapper(patterns.NonesPerRow()).eval()
    sample = {"x": torch.randn(2, 6, 8), "grid": torch.tensor([[1, 2, 3]])}
    traced = trace_model(model, sample, TracingOptions(sequential_targets=("Block",)), name="t")
    assert traced.failure is None
    settled = settle(traced, verify_on_sample, fix=True)
    failure = settled.first.failure
    assert failure is not None and failure.kind == "replay" and failure.location is not None
    assert failure.location.line == line_of(patterns.NonesPerRow, "x[index] if extra is None")
    assert failure.module_path == "model" and failure.module_class == "NonesPerRow"
    assert settled.attempt.ok and settled.applied is not None
    assert settled.applied.tracing_ignore == ["NonesPerRow.prepare"]
    with torch.no_grad():
        torch.testing.assert_close(
            replay(model, settled.attempt.traced.subgraphs, sample), model(**sample)
        )
