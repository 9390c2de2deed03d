"""llmc-trace: make large models traceable for memory-efficient compression.

The public API: :func:`attempt_trace` (trace, partition and verify a model named by hub id,
folder or built-in), :func:`trace_subgraphs` and :func:`topological_partition` (the
llm-compressor contract), :class:`Subgraph`, :class:`TraceReport` and :class:`TraceFailure`.
"""

from llmc_trace.attempt import attempt_trace, trace_subgraphs
from llmc_trace.diagnose.failure import TraceFailure
from llmc_trace.errors import BadInputError, LlmcTraceError, VerificationError
from llmc_trace.graph.partition import topological_partition
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.report import TraceReport

__all__ = [
    "BadInputError",
    "LlmcTraceError",
    "Subgraph",
    "TraceFailure",
    "TraceReport",
    "VerificationError",
    "attempt_trace",
    "topological_partition",
    "trace_subgraphs",
]
