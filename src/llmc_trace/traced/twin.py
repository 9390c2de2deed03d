"""Prove a traced model's subgraphs: replay them against eager on its tiny twin (or weights).

The full-size model lives on ``meta``, where nothing can be compared, so the proof runs on the
*tiny twin*: the same architecture and code paths at small sizes with seeded random weights,
traced on its own (its own trace, with the same options) and replayed against its own eager
forward. The proof carries over only if the twin's trace has the full model's structure, which
:func:`~llmc_trace.graph.structure.compare_structure` checks. A folder's real weights can
stand in for the twin; then the model itself is traced and replayed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from llmc_trace.graph.structure import StructureCheck, compare_structure
from llmc_trace.graph.verify import Verification, verify_subgraphs
from llmc_trace.models.build import build_twin, load_pretrained
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import ModelSource
from llmc_trace.traced.model import TracedModel, trace_model
from llmc_trace.tracing.trace import concrete_arguments


@dataclass(frozen=True)
class TwinCheck:
    """The replay verdict on the twin (or real weights), and the twin's own traced model.

    ``structure`` is ``None`` when the model itself was replayed (real weights): there is
    nothing to carry over. ``timings_s`` holds ``twin_s`` (or ``load_s``), ``twin_trace_s``
    and ``verify_s``.
    """

    verification: Verification
    structure: StructureCheck | None
    verified_on: str
    twin: TracedModel | None
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verification.ok and (self.structure is None or self.structure.matches)


def verify_on_twin(
    traced: TracedModel, modality: str, options: SampleOptions, *, seed: int = 0
) -> TwinCheck:
    """Trace the twin of ``traced.source`` with ``traced``'s options and replay it."""
    source = _source_of(traced)
    start = time.perf_counter()
    tracing = traced.options
    twin = build_twin(source, seed=seed, min_layers=max(2, 2 * tracing.targets_per_subgraph))
    built_s = time.perf_counter() - start
    return _check(traced, twin, modality, options, "tiny twin", {"twin_s": built_s})


def verify_on_weights(traced: TracedModel, modality: str, options: SampleOptions) -> TwinCheck:
    """Load the folder's real weights, trace that model the same way and replay it."""
    source = _source_of(traced)
    start = time.perf_counter()
    model = load_pretrained(source, dtype=torch.float32)
    return _check(
        traced, model, modality, options, "real weights", {"load_s": time.perf_counter() - start}
    )


def _check(
    traced: TracedModel,
    model: torch.nn.Module,
    modality: str,
    options: SampleOptions,
    verified_on: str,
    timings_s: dict[str, float],
) -> TwinCheck:
    sample = make_sample(model.config, modality, options)
    twin = trace_model(model, sample, traced.options, name=traced.name, source=traced.source)
    timings_s["twin_trace_s"] = twin.timings_s["trace_s"]
    if twin.partitioned is None:
        reason = twin.failure.exception if twin.failure else "unknown"
        problem = f"the {verified_on} did not trace although the full model did: {reason}"
        return TwinCheck(
            Verification(False, 0.0, [], [problem]), None, verified_on, None, timings_s
        )
    start = time.perf_counter()
    verification = verify_subgraphs(
        model,
        twin.subgraphs,
        sample,
        twin.partitioned.trace.input_names,
        traced.options.targets_per_subgraph,
        eager_kwargs=concrete_arguments(model, {}),
    )
    timings_s["verify_s"] = time.perf_counter() - start
    structure = (
        compare_structure(traced.subgraphs, twin.subgraphs) if verified_on == "tiny twin" else None
    )
    return TwinCheck(verification, structure, verified_on, twin, timings_s)


def _source_of(traced: TracedModel) -> ModelSource:
    if traced.source is None:
        raise ValueError(f"{traced.name} was traced from a module, not a source: no twin to build")
    return traced.source
