"""``attempt_trace``: trace, partition and verify a model; the report; the coverage run."""

from llmc_trace.attempt.trace_report import TraceReport
from llmc_trace.attempt.prove import attempt_trace, trace_subgraphs

__all__ = ["TraceReport", "attempt_trace", "trace_subgraphs"]
