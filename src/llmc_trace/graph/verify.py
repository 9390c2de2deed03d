"""Prove that running the subgraphs in order reproduces the model's output.

The reference is computed another way: an ordinary eager ``model(**sample)`` call. The replay
keeps an intermediates dict exactly as a calibration pipeline would, dropping each subgraph's
``consumed_names`` after it runs, so a name dropped too early shows up as a missing input
here rather than as a crash (or silently stale data) halfway through a calibration run.

The replay runs first, on the weights the trace saw, since an eager forward may change the
model it runs (RWKV rescales its weights on its first call). Both runs start from the same
random state, in a forked RNG so the caller's is untouched: some models draw random numbers in
eval mode on purpose (SpeechT5's decoder prenet keeps its dropout on), and a replay that draws
them in the eager order must reproduce them exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.graph.compiled import failing_operation
from llmc_trace.graph.subgraph import MODEL_OUTPUT, Subgraph
from llmc_trace.tracing.source import SourceLocation


@dataclass(frozen=True)
class OutputComparison:
    """One output tensor: replay against eager."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    matches: bool


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_subgraphs` found; ``ok`` only when every check passed."""

    ok: bool
    tolerance: float
    outputs: list[OutputComparison]
    problems: list[str] = field(default_factory=list)
    replay_s: float = 0.0
    eager_s: float = 0.0
    #: A replay that raised where eager did not: the error, and where the model made the
    #: failing operation (line, module path and class), when the replay located it.
    replay_error: str = ""
    failed_at: tuple[SourceLocation, str, str] | None = None

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)


def flatten_output(value: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Name every tensor in a model output (``logits``, ``past_key_values.0.1``, ...)."""
    found: dict[str, torch.Tensor] = {}
    if isinstance(value, torch.Tensor):
        found[prefix or "output"] = value
    elif isinstance(value, dict):
        for key, item in value.items():
            found.update(flatten_output(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found.update(flatten_output(item, f"{prefix}.{i}" if prefix else str(i)))
    return found


def replay(
    model: torch.nn.Module,
    subgraphs: list[Subgraph],
    inputs: dict[str, Any],
    problems: list[str] | None = None,
) -> Any:
    """Run the subgraphs in order like a pipeline would; returns the model output."""
    cache: dict[str, Any] = dict(inputs)
    dropped: dict[str, int] = {}
    output: Any = None
    for subgraph in subgraphs:
        missing = [name for name in subgraph.input_names if name not in cache]
        if missing:
            detail = ", ".join(
                f"{name} (dropped after subgraph {dropped[name]})" if name in dropped else name
                for name in missing
            )
            raise KeyError(f"subgraph {subgraph.index} reads values no longer cached: {detail}")
        results = subgraph.forward(model, **{n: cache[n] for n in subgraph.input_names})
        output = results.pop(MODEL_OUTPUT, output)
        cache.update(results)
        for name in subgraph.consumed_names:
            cache.pop(name, None)
            dropped[name] = subgraph.index
    if problems is not None:
        leftover = [name for name in cache if name not in inputs]
        if leftover:
            problems.append(f"intermediates still cached after the last subgraph: {leftover}")
    return output


def verify_subgraphs(
    model: torch.nn.Module,
    subgraphs: list[Subgraph],
    sample: dict[str, Any],
    graph_inputs: list[str],
    targets_per_subgraph: int = 1,
    tolerance: float | None = None,
    eager_kwargs: dict[str, Any] | None = None,
) -> Verification:
    """Replay ``subgraphs`` on ``sample`` and compare every output tensor with eager.

    The tolerance defaults to 1e-5 for float32 and scales with the output dtype's epsilon
    otherwise. Also checks that each subgraph holds at most ``targets_per_subgraph`` targets.
    """
    problems: list[str] = []
    for subgraph in subgraphs:
        if len(subgraph.targets) > targets_per_subgraph:
            problems.append(
                f"subgraph {subgraph.index} holds {len(subgraph.targets)} targets "
                f"({', '.join(subgraph.targets)}), more than {targets_per_subgraph}"
            )
    actual: Any = None  # the replay runs first (see the module docstring)
    replay_error: Exception | None = None
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            actual = replay(model, subgraphs, {k: sample[k] for k in graph_inputs}, problems)
        except Exception as err:  # a replay crash is a verification verdict, not a bug here
            replay_error = err
        replay_s = time.perf_counter() - start
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            expected = model(**sample, **(eager_kwargs or {}))
        except Exception as err:  # the model itself cannot run this sample: nothing to compare
            problems.append(f"the eager forward failed: {type(err).__name__}: {err}")
            return Verification(False, tolerance or 0.0, [], problems)
        eager_s = time.perf_counter() - start
    if replay_error is not None:
        said = f"{type(replay_error).__name__}: {replay_error}"
        problems.append(f"replay failed: {said}")
        failed_at = failing_operation(replay_error)
        return Verification(False, tolerance or 0.0, [], problems, 0.0, eager_s, said, failed_at)
    expected_flat = flatten_output(expected)
    actual_flat = flatten_output(actual)
    if expected_flat.keys() != actual_flat.keys():
        problems.append(
            f"outputs differ in structure: eager has {sorted(expected_flat)}, "
            f"replay has {sorted(actual_flat)}"
        )
    comparisons = []
    for name, reference in expected_flat.items():
        if name not in actual_flat:
            continue
        got = actual_flat[name]
        limit = tolerance if tolerance is not None else default_tolerance(reference.dtype)
        if got.shape != reference.shape:
            problems.append(f"{name}: shape {tuple(got.shape)} != eager {tuple(reference.shape)}")
            comparisons.append(OutputComparison(name, tuple(reference.shape), float("inf"), False))
            continue
        diff = _max_abs_diff(got, reference)
        comparisons.append(OutputComparison(name, tuple(reference.shape), diff, diff <= limit))
        if diff > limit:
            problems.append(f"{name}: max abs difference {diff:.3g} exceeds {limit:.1g}")
    used = tolerance if tolerance is not None else default_tolerance(torch.float32)
    return Verification(not problems, used, comparisons, problems, replay_s, eager_s)


def default_tolerance(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point:
        return 0.0
    return (
        1e-5
        if dtype in (torch.float32, torch.float64)
        else 1e-5 * (torch.finfo(dtype).eps / torch.finfo(torch.float32).eps)
    )


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    if not a.dtype.is_floating_point:
        return float((a.long() - b.long()).abs().max())
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = (a.double() - b.double()).abs().masked_fill(both_nan, 0.0)
    return float(diff.nan_to_num(nan=float("inf")).max())
