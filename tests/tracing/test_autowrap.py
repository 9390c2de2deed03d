"""Autowrap: a failing statement written directly in a forward becomes one recorded call.

Each pattern fails without a fix at its own line; with the autowrap fix that the search
proposes, it traces, and replaying the subgraphs equals the eager forward, also on a batch
that takes the statement's other branch (so the statement runs on real data, not baked in).
Nothing is left behind: the model file is unchanged and the class's code is restored.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import pytest
import torch

from llmc_trace.diagnose.fixes import Fix, candidate_fixes
from llmc_trace.errors import BadInputError
from llmc_trace.graph.partition import partition_trace
from llmc_trace.graph.verify import verify_subgraphs
from llmc_trace.tracing.autowrap import autowrap_entry
from llmc_trace.tracing.rewrite import EXTRACTED_PREFIX
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import trace_graph
from tests.patterns import untraceable as patterns


def line_in_forward(cls: type, text: str) -> int:
    lines, start = inspect.getsourcelines(cls.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def sample(grid: list[int]) -> dict[str, torch.Tensor]:
    return {
        "x": torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(0)),
        "grid": torch.tensor([grid]),
    }


# (pattern, wrapped at module path "model", failing text, kind, grids that take both paths)
CASES = [
    (patterns.ForwardBranch, False, "if grid.sum() > 4", "control_flow", ([1, 2, 2], [1, 1, 1])),
    (patterns.ForwardLoop, True, "for t, h, w in", "tensor_to_python", ([1, 2, 2], [2, 3, 1])),
    (patterns.ForwardAssert, True, "assert grid.min()", "control_flow", ([1, 2, 2], [0, 0, 5])),
    (patterns.ForwardTemporary, True, "if grid.sum() > 4", "control_flow", ([1, 2, 2], [1, 1, 1])),
]


each_case = pytest.mark.parametrize(
    ("cls", "wrapped", "text", "kind", "grids"), CASES, ids=lambda v: getattr(v, "__name__", None)
)


def build(cls: type, wrapped: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return (patterns.Wrapper(cls()) if wrapped else cls()).eval()


def autowrap_fix_for(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Fix:
    failure = patterns.failure_of(model, batch, ["Block"])
    [fix] = [f for f in candidate_fixes(failure, model) if f.kind == "autowrap"]
    return fix


@each_case
def test_statement_in_forward_fails_where_written(
    cls: type, wrapped: bool, text: str, kind: str, grids: tuple[list[int], ...]
) -> None:
    model = build(cls, wrapped)
    failure = patterns.failure_of(model, sample(grids[0]), ["Block"])
    assert failure.kind == kind
    assert failure.location is not None
    assert failure.location.abs_file == inspect.getsourcefile(cls)
    assert failure.location.line == line_in_forward(cls, text)
    assert failure.location.function == f"{cls.__name__}.forward"
    assert failure.module_path == ("model" if wrapped else "")
    # no helper function holds the statement: the opaque fix has nothing to offer
    assert [f.kind for f in candidate_fixes(failure, model)] == ["autowrap"]


@each_case
def test_autowrap_traces_and_replays_like_eager(
    cls: type, wrapped: bool, text: str, kind: str, grids: tuple[list[int], ...]
) -> None:
    model = build(cls, wrapped)
    source = Path(inspect.getsourcefile(cls))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    forward, code = cls.forward, cls.forward.__code__
    fix = autowrap_fix_for(model, sample(grids[0]))
    assert fix.tracing_ignore == (
        autowrap_entry(f"{cls.__name__}.forward", line_in_forward(cls, text)),
    )
    assert fix.rewrites and fix.rewrites[0].before.startswith(text.split(" ")[0])

    trace = trace_graph(
        model, sample(grids[0]), TracingOptions.parse(model, fix.tracing_ignore, ["Block"])
    )
    recorded = [
        n
        for n in trace.graph.nodes
        if n.op == "call_function"
        and getattr(n.target, "__name__", "").startswith(EXTRACTED_PREFIX)
    ]
    assert len(recorded) == 1
    assert [r.line for r in trace.rewrites] == [line_in_forward(cls, text)]
    subgraphs = partition_trace(trace).subgraphs
    prefix = "model." if wrapped else ""
    assert [s.targets for s in subgraphs if s.targets] == [
        [f"{prefix}layers.0"],
        [f"{prefix}layers.1"],
    ]
    for grid in grids:  # the second grid takes the statement's other path at calibration time
        verification = verify_subgraphs(model, subgraphs, sample(grid), trace.input_names)
        assert verification.ok, verification.problems
        assert verification.max_abs_diff == 0.0

    assert hashlib.sha256(source.read_bytes()).hexdigest() == digest
    assert cls.forward is forward and cls.forward.__code__ is code
    assert not [name for name in vars(patterns) if name.startswith(EXTRACTED_PREFIX)]


def test_replayed_assert_still_checks_real_batches() -> None:
    """The moved ``assert`` runs at calibration time: a batch that breaks it is refused."""
    model = build(patterns.ForwardAssert, True)
    fix = autowrap_fix_for(model, sample([1, 2, 2]))
    trace = trace_graph(
        model, sample([1, 2, 2]), TracingOptions.parse(model, fix.tracing_ignore, ["Block"])
    )
    bad = sample([1, -1, 2])
    values = dict(bad)
    with pytest.raises(AssertionError, match="must not be negative"):
        for subgraph in partition_trace(trace).subgraphs:
            values.update(subgraph.forward(model, **{n: values[n] for n in subgraph.input_names}))


def test_before_and_after_show_the_moved_statement() -> None:
    model = build(patterns.ForwardLoop, True)
    fix = autowrap_fix_for(model, sample([1, 2, 2]))
    (rewrite,) = fix.rewrites
    assert rewrite.before == "for t, h, w in grid.tolist():\n    x = x + t * h * w * self.scale"
    assert rewrite.parameters == ["self", "grid", "x"]
    assert rewrite.after == (
        f"def {EXTRACTED_PREFIX}forward_L{rewrite.line}(self, grid, x):\n"
        "    for t, h, w in grid.tolist():\n"
        "        x = x + t * h * w * self.scale\n"
        "    return x\n\n"
        f"x = {EXTRACTED_PREFIX}forward_L{rewrite.line}(self, grid, x)"
    )


def test_a_statement_that_returns_is_refused_with_the_reason() -> None:
    model = build(patterns.EarlyReturn, False)
    fix = autowrap_fix_for(model, sample([1, 2, 2]))
    assert "returns from its function" in fix.refusal


def test_an_entry_naming_no_function_is_bad_input() -> None:
    model = build(patterns.ForwardBranch, False)
    with pytest.raises(BadInputError, match="NoSuchModel.forward"):
        options = TracingOptions.parse(model, ["autowrap:NoSuchModel.forward@3"], ["Block"])
        trace_graph(model, sample([1, 2, 2]), options)


def test_a_statement_that_calls_a_target_is_refused() -> None:
    """One graph call around a target would hide it from calibration, although replay matches."""
    model = build(patterns.BranchAroundLayer, True)
    fix = autowrap_fix_for(model, sample([1, 2, 2]))
    with pytest.raises(BadInputError, match=r"hides the sequential targets model\.layers\.0"):
        trace_graph(
            model, sample([1, 2, 2]), TracingOptions.parse(model, fix.tracing_ignore, ["Block"])
        )
