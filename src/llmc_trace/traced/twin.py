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
from typing import Any
from dataclasses import dataclass, field

import torch

from transformers import PretrainedConfig

from llmc_trace.graph.structure import StructureCheck, compare_structure
from llmc_trace.graph.verify import Verification, verify_subgraphs
from llmc_trace.models.build import build_twin, load_pretrained, twin_of_class
from llmc_trace.models.samples import SampleOptions, supported_modalities
from llmc_trace.models.source import ModelSource
from llmc_trace.traced.model import TracedModel, trace_model
from llmc_trace.traced.probe import sample_for
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
    sample = sample_for(twin, modality, options)
    return _check(traced, twin, sample, "tiny twin", {"twin_s": built_s})


def verify_instance(traced: TracedModel, *, seed: int = 0) -> TwinCheck:
    """Prove a model the caller built: on the twin of its own class and config, else replay
    the model itself on the sample.

    The twin keeps the proof cheap for a large model (the check runs once per fix tried); its
    sample has the caller's batch size and sequence length, since code that loops over the
    batch traces one branch per row. A model without a transformers config (or whose config
    cannot shrink, or whose modality has no sample builder) is replayed on ``traced.sample``,
    which needs its real weights; so is one whose twin traces another structure or none (its
    sample, laid out by the type's processor, say, took another path through the model than
    the caller's did), since the twin then proves a different graph.
    """
    model, modality = traced.model, sample_modality(traced.sample)
    config = getattr(model, "config", None)
    if isinstance(config, PretrainedConfig) and modality in supported_modalities(
        config, type(model)
    ):
        start = time.perf_counter()
        try:
            attention = getattr(config, "_attn_implementation", None) or "eager"
            twin = twin_of_class(type(model), config, seed=seed, attn_implementation=attention)
            options = SampleOptions(
                seq_len=_sequence_length(traced.sample),
                batch_size=_batch_size(traced.sample),
                seed=seed,
            )
            sample = sample_for(twin, modality, options)
        except Exception:  # noqa: BLE001 - any failure here only means: no twin to prove on
            twin = None
        if twin is not None:
            timings = {"twin_s": time.perf_counter() - start}
            check = _check(traced, twin, sample, "tiny twin", timings)
            if check.ok or not _has_weights(model) or not _another_path(check):
                return check
    return verify_on_sample(traced)


def verify_on_sample(traced: TracedModel) -> TwinCheck:
    """Replay ``traced`` on its own sample against the model's own eager forward."""
    if not _has_weights(traced.model):
        problem = f"{traced.name} has no twin to prove on, and its weights are on meta"
        return TwinCheck(Verification(False, 0.0, [], [problem]), None, "the sample", None)
    start = time.perf_counter()
    verification = verify_subgraphs(
        traced.model,
        traced.subgraphs,
        traced.sample,
        traced.partitioned.trace.input_names if traced.partitioned else [],
        traced.options.targets_per_subgraph,
        eager_kwargs=concrete_arguments(traced.model, traced.sample),
    )
    timings = {"verify_s": time.perf_counter() - start}
    return TwinCheck(verification, None, "the sample", None, timings)


def _another_path(check: TwinCheck) -> bool:
    """The twin's sample did not take the caller's path: the twin traced another structure,
    or did not trace at all where the caller's model did."""
    return check.twin is None or (check.structure is not None and not check.structure.matches)


def _has_weights(model: torch.nn.Module) -> bool:
    return not any(p.is_meta for p in model.parameters())


def sample_modality(sample: dict[str, object]) -> str:
    """The modality a processor output is for, read from its keys."""
    if "pixel_values_videos" in sample:
        return "video"
    if "pixel_values" in sample:
        return "image"
    if "input_features" in sample or "input_values" in sample:
        return "audio"
    return "text"


def _batch_size(sample: dict[str, object]) -> int:
    """Rows in the sample's text (one when it has none)."""
    ids = sample.get("input_ids")
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) and ids.dim() > 1 else 1


def _sequence_length(sample: dict[str, object]) -> int:
    ids = sample.get("input_ids")
    return int(ids.shape[-1]) if isinstance(ids, torch.Tensor) else SampleOptions().seq_len


def verify_on_weights(traced: TracedModel, modality: str, options: SampleOptions) -> TwinCheck:
    """Load the folder's real weights, trace that model the same way and replay it."""
    source = _source_of(traced)
    start = time.perf_counter()
    model = load_pretrained(source, dtype=torch.float32)
    timings = {"load_s": time.perf_counter() - start}
    return _check(traced, model, sample_for(model, modality, options), "real weights", timings)


def _check(
    traced: TracedModel,
    model: torch.nn.Module,
    sample: dict[str, Any],
    verified_on: str,
    timings_s: dict[str, float],
) -> TwinCheck:
    """Trace ``model`` (a twin, or the real weights) on ``sample`` with ``traced``'s options and
    replay it against its eager forward."""
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
