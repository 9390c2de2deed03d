"""The independent pipeline: each compressor gets its own pass, with its own pipeline.

Pruning and quantization recipes that must see each other's results in full (prune the whole
model, then quantize the pruned model) run as stages: stage k calibrates on the model as
stages 1..k-1 left it. Each stage is a complete pipeline run, chosen for it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmc_trace.pipelines.sequential import PipelineStats

#: One stage: a ready-to-run pipeline (its model, data and callbacks bound in).
Stage = Callable[[], PipelineStats]


def run_independent(stages: Sequence[Stage]) -> list[PipelineStats]:
    """Run ``stages`` one after another; returns each stage's statistics in order."""
    return [stage() for stage in stages]
