"""The traced model: one trace per run, shared by attempt, render, plan, the pipelines and compress."""

from llmc_trace.traced.model import TracedModel, display_name, trace_model, trace_source
from llmc_trace.traced.summary import SubgraphSummary
from llmc_trace.traced.twin import TwinCheck, verify_on_twin, verify_on_weights

__all__ = [
    "SubgraphSummary",
    "TracedModel",
    "TwinCheck",
    "display_name",
    "trace_model",
    "trace_source",
    "verify_on_twin",
    "verify_on_weights",
]
