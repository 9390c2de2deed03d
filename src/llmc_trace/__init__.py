"""llmc-trace: make large models traceable for memory-efficient compression.

The public API: :func:`attempt_trace` (trace, partition and verify a model named by hub id,
folder or built-in), :func:`trace_subgraphs` and :func:`topological_partition` (the
llm-compressor contract), :func:`trace_source` and :class:`TracedModel` (one trace shared by
every step), :class:`TracingSettings` (how any of them traces), :func:`compress` with its
:class:`CompressRequest`, :class:`Subgraph`, :class:`TraceReport`, :class:`TraceFailure`
and the errors.

Names are imported when first used (PEP 562), so ``import llmc_trace`` and ``llmc-trace
--help`` stay fast: torch and transformers load only when something needs them.
"""

from __future__ import annotations

from llmc_trace.core.lazy import lazy_attributes

_WHERE = {
    "attempt_trace": "llmc_trace.attempt.prove",
    "trace_subgraphs": "llmc_trace.attempt.prove",
    "TraceReport": "llmc_trace.attempt.trace_report",
    "compress": "llmc_trace.oneshot.driver",
    "CompressRequest": "llmc_trace.oneshot.request",
    "TraceFailure": "llmc_trace.diagnose.failure",
    "topological_partition": "llmc_trace.graph.partition",
    "Subgraph": "llmc_trace.graph.subgraph",
    "TracedModel": "llmc_trace.traced.model",
    "trace_source": "llmc_trace.traced.model",
    "TracingSettings": "llmc_trace.tracing.settings",
    "BadInputError": "llmc_trace.errors",
    "LlmcTraceError": "llmc_trace.errors",
    "VerificationError": "llmc_trace.errors",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes("llmc_trace", _WHERE)
