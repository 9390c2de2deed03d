"""The trace a run calibrates through: made once on the first calibration batch, fixed as
``attempt --fix`` would, proved on the tiny twin, and shared by the stages that can share it."""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.traced.settle import settle
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.source import ModelSource
from llmc_trace.tracing.settings import TracingSettings
from llmc_trace.traced.model import TracedModel, display_name, trace_model
from llmc_trace.traced.twin import TwinCheck, verify_on_twin
from llmc_trace.tracing.options import TracingOptions


class RunTrace:
    """The tracing options a run settled on and its latest trace.

    The first stage parses the request's tracing settings and settles the fixes; later stages
    trace with those options. In memory, stages share one model object, and the trace (and
    its proof) made for an earlier stage holds for the later ones: only the weights changed.
    """

    def __init__(self, source: ModelSource, settings: TracingSettings, modality: str) -> None:
        self.source = source
        self.settings = settings
        self.modality = modality
        self.options: TracingOptions | None = None
        self.traced: TracedModel | None = None
        self.check: TwinCheck | None = None

    def trace(
        self, model: torch.nn.Module, batch: dict[str, Any], *, needs_data: bool
    ) -> tuple[TracedModel, TwinCheck | None]:
        """This stage's trace of ``model`` on ``batch`` and its proof (``None`` when the
        stage needs no data, which needs no proof)."""
        if self.traced is not None and self.traced.model is model:
            if self.check is not None or not needs_data:
                return self.traced, self.check
        if self.options is None:
            settings = self.settings
            self.options = TracingOptions.parse(
                model,
                settings.tracing_ignore,
                settings.sequential_targets,
                settings.targets_per_subgraph,
            )
        traced, check = trace_for_calibration(
            self.source, model, batch, self.options, self.modality, needs_data=needs_data
        )
        self.options, self.traced, self.check = traced.options, traced, check
        return traced, check

    def ignore_list(self) -> list[str]:
        """The tracing ignore list as settled, fixes included (what ``recipe.yaml`` records)."""
        assert self.options is not None, "no stage has traced yet"
        return self.options.tracing_ignore()


def trace_for_calibration(
    source: ModelSource,
    model: torch.nn.Module,
    batch: dict[str, Any],
    options: TracingOptions,
    modality: str,
    *,
    needs_data: bool,
) -> tuple[TracedModel, TwinCheck | None]:
    """Trace ``model`` once on the first calibration batch, fixed as ``attempt --fix`` would.

    The batch is a real one, images and all when the rows carry them, so the fixes are the
    ones calibration needs; the twin proves them on a sample of the same ``modality``.

    For methods that calibrate on data the trace is proved on the tiny twin, and a failure
    starts the fix search; a fix that does not verify is not used, and a model that does not
    trace still calibrates through a pipeline that needs no trace (the plan leaves
    sequential out).
    """
    traced = trace_model(model, batch, options, name=display_name(source), source=source)
    if not needs_data:
        return traced, None
    ids = batch["input_ids"]
    sample = SampleOptions(seq_len=int(ids.shape[1]), batch_size=int(ids.shape[0]))
    settled = settle(
        traced, lambda candidate: verify_on_twin(candidate, modality, sample), fix=True
    )
    return settled.fixed.traced, settled.fixed.check
