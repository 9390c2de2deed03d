"""``attempt_trace``: trace a model from its config once, partition it, and prove the partition.

The full-size model is traced on ``meta`` (so a 405B config costs no memory) to give the
subgraphs and their memory figures; its tiny twin is traced the same way and replayed against
its own eager forward (:mod:`llmc_trace.traced.twin`). With ``fix``, a failure starts the fix
search, settled as every caller settles a trace (:mod:`llmc_trace.traced.settle`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from llmc_trace.core.deprecation import renamed
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.diagnose.search import FixAttempt
from llmc_trace.errors import BadInputError, NotTraceableError
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.weights import check_weight_files
from llmc_trace.models.source import ModelSource, quantized_method, resolve_model
from llmc_trace.traced.model import TracedModel, trace_model, trace_source
from llmc_trace.traced.settle import settle
from llmc_trace.traced.twin import (
    TwinCheck,
    verify_instance,
    verify_on_twin,
    verify_on_weights,
)
from llmc_trace.tracing.options import TracingOptions, known_ignore
from llmc_trace.tracing.settings import TracingSettings, tracing_settings

logger = logging.getLogger(__name__)


def trace_subgraphs(
    model: torch.nn.Module,
    sample_input: dict[str, Any],
    sequential_targets: str | list[str] | None = None,
    tracing_ignore: str | list[str] | None = None,
    targets_per_subgraph: int = 1,
    *,
    fix: bool = True,
    ignore: str | list[str] | None = None,
) -> list[Subgraph]:
    """Trace ``model`` on ``sample_input`` and cut it into subgraphs, one target group each.

    Same contract as llm-compressor's ``trace_subgraphs``: executing the subgraphs in order is
    equivalent to executing the model. ``sequential_targets=None`` means the model's repeated
    blocks; a string is one target (``"LlamaDecoderLayer"``). ``tracing_ignore`` (the fourth
    argument, where llm-compressor passes its ``ignore``) is a program's list,
    as llm-compressor's default ``tracing_ignore`` is one list for every model: names that
    match nothing in ``model`` are dropped with one warning listing them, a likely typo with
    its closest name (:func:`~llmc_trace.tracing.options.known_ignore`; the command line
    refuses them instead, since a person typed them).

    When tracing fails and ``fix`` is set, the fixes ``attempt --fix`` would try are tried,
    each proved on a tiny twin built from the model's class and config (on the sample itself
    when there is none); the first that verifies is used and logged as a warning. When none
    does, :class:`~llmc_trace.errors.NotTraceableError` says where tracing stopped, with
    ``failure`` (a :class:`~llmc_trace.diagnose.failure.TraceFailure`) and ``fixes`` (what
    was tried) on it. The keyword ``ignore=`` is a deprecated spelling of ``tracing_ignore=``.
    """
    if ignore is not None:
        if tracing_ignore is not None:
            raise TypeError("trace_subgraphs() got tracing_ignore= and ignore=; pass one")
        renamed("trace_subgraphs(ignore=)", "trace_subgraphs(tracing_ignore=)")
        tracing_ignore = ignore
    targets = [sequential_targets] if isinstance(sequential_targets, str) else sequential_targets
    known = known_ignore(model, tracing_ignore or [])
    options = TracingOptions.parse(model, known, targets, targets_per_subgraph)
    return trace_instance(model, sample_input, options, fix=fix).subgraphs


def trace_instance(
    model: torch.nn.Module, sample: dict[str, Any], options: TracingOptions, *, fix: bool = True
) -> TracedModel:
    """:func:`trace_subgraphs`'s trace, as the :class:`TracedModel` the pipelines run: traced
    as written, else with the first fix that verifies (logged); raises
    :class:`~llmc_trace.errors.NotTraceableError` when neither traces."""
    traced = trace_model(model, sample, options, name=type(model).__name__)
    if traced.traced:
        return traced
    settled = settle(traced, verify_instance, fix=True) if fix else None
    if settled is not None and settled.applied is not None:
        logger.warning(
            "%s did not trace as written; traced with the verified fix: %s (tracing_ignore=%s)",
            traced.name,
            settled.applied.description,
            settled.applied.tracing_ignore,
        )
        return settled.fixed.traced
    raise not_traceable(traced.failure, settled.tried if settled else [], traced.name)


def not_traceable(
    failure: TraceFailure | None, tried: list[FixAttempt], name: str
) -> NotTraceableError:
    """The error for a model that did not trace, located, with the fixes that were tried."""
    where = f" at {failure.location}" if failure and failure.location else ""
    inside = f" in {failure.module_path} ({failure.module_class})" if failure else ""
    what = f"{failure.explanation}: {failure.exception}" if failure else "unknown failure"
    outcomes = "; ".join(f"{attempt.description}: {attempt.outcome}" for attempt in tried)
    return NotTraceableError(
        f"{name} is not traceable: {what}{where}{inside}."
        + (f" Fixes tried: {outcomes}." if outcomes else ""),
        hint="Run `llmc-trace attempt --fix` on the model to see the failure and the fixes "
        "drawn, or add the failing module or function to ignore.",
        failure=failure,
        fixes=tried,
    )


def attempt_trace(
    model: str | ModelSource,
    *,
    tracing: TracingSettings | None = None,
    modality: str = "text",
    seq_len: int = 32,
    image_size: int | None = None,
    verify: bool = True,
    real_weights: bool = False,
    fix: bool = False,
    seed: int = 0,
    decisions: bool = True,
    progress: Progress | None = None,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int | None = None,
) -> TraceReport:
    """Trace, partition and verify ``model`` as ``tracing`` says; never raises for an
    untraceable model. ``sequential_targets``, ``ignore`` and ``targets_per_subgraph`` are
    deprecated spellings of ``tracing``'s fields.

    Bad input (unknown model, unsupported modality, targets that match nothing) raises
    :class:`~llmc_trace.errors.BadInputError` before any tracing. An untraceable model gives a
    report with ``failure`` set. ``real_weights`` verifies on the folder's weights instead of
    the twin (the folder must hold safetensors). ``fix`` searches for fixes when tracing
    fails (see :mod:`~llmc_trace.diagnose.search`); the report lists every fix tried and
    ``applied_fix`` holds the working configuration. ``decisions`` (on unless turned off) records
    every branch the trace took (``report.decisions``, :mod:`~llmc_trace.tracing.decisions`).
    ``report.traced_model`` is the traced model itself, for drawing or planning without
    tracing again.

    >>> report = attempt_trace("meta-llama/Llama-3.1-8B-Instruct")   # doctest: +SKIP
    >>> report.ok, len(report.subgraphs)                              # doctest: +SKIP
    (True, 33)
    """
    settings = tracing_settings(
        tracing,
        "attempt_trace",
        {
            "sequential_targets": sequential_targets,
            "ignore": ignore,
            "targets_per_subgraph": targets_per_subgraph,
        },
    )
    report_progress = progress or no_progress
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    if real_weights:  # before tracing: pickles, truncation, lost shards
        folder = source.weights_folder(
            "verify on", param="real_weights", hint="Drop --real-weights (the twin verifies), or"
        )
        check_weight_files(folder)
        method = quantized_method(source)
        if method is not None:
            raise BadInputError(
                f"{source.name} stores quantized weights ({method}): its tensors are integers "
                "and scales, not weights a replay can be checked against.",
                hint="Drop --real-weights (the tiny twin verifies the architecture's trace), "
                "or point --model at the checkpoint it was made from.",
                param="real_weights",
            )
    options = SampleOptions(seq_len=seq_len, image_size=image_size, seed=seed)
    report_progress("trace", 0, 3)
    traced = trace_source(
        source,
        tracing=settings,
        modality=modality,
        sample_options=options,
        record_decisions=decisions,
    )

    def check(candidate: TracedModel) -> TwinCheck:
        report_progress("verify", 1, 3)
        if real_weights:
            return verify_on_weights(candidate, modality, options)
        return verify_on_twin(candidate, modality, options, seed=seed)

    settled = settle(traced, check if verify else None, fix=fix)
    report_progress("done", 3, 3)
    final = settled.attempt
    report = TraceReport.of(final.traced, final.check, modality, settings.sequential_targets)
    return dataclasses.replace(
        report,
        timings_s={"build_s": traced.timings_s["build_s"], **report.timings_s},
        fixes=settled.tried,
        applied_fix=settled.applied,
    )
