"""Memory plans: estimate each pipeline's peak memory and choose one, with the reason."""

from llmc_trace.plan.choose import MemoryPlan, choose_pipeline
from llmc_trace.pipelines.estimate import PipelineEstimate, RunSettings
from llmc_trace.plan.estimate import estimate_pipelines
from llmc_trace.plan.memory import plan_memory, plan_source

__all__ = [
    "MemoryPlan",
    "PipelineEstimate",
    "RunSettings",
    "choose_pipeline",
    "estimate_pipelines",
    "plan_memory",
    "plan_source",
]
