"""What the stages of one ``compress`` run share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.core.device_peak import DevicePeaks
from llmc_trace.core.progress import Progress
from llmc_trace.core.world import World
from llmc_trace.data import CalibrationSet, load_calibration
from llmc_trace.data.multimodal import load_multimodal_calibration
from llmc_trace.models.source import ModelSource
from llmc_trace.oneshot.solve import LayerResult
from llmc_trace.oneshot.report import build_report
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.result import ResumeStats, StageResult
from llmc_trace.oneshot.resume import Unfinished
from llmc_trace.oneshot.settle import RunTrace
from llmc_trace.oneshot.stage import Stage
from llmc_trace.report.schema import CompressionReport


@dataclass(frozen=True)
class Pruned:
    """The mask an earlier stage left: which layers, to what structure (a quantizing stage
    after it keeps those zeros, and the checkpoint records the sparsity)."""

    sparsity: Sparsity
    layers: list[str]


@dataclass
class RunState:
    """The request, where it runs, and what its stages leave for the ones after them: the
    calibration rows (loaded once), the settled trace, the pruning mask, each stage's result
    and, once the checkpoint is written, the report written into it; whether the run keeps
    resume points, the interrupted run it continues, and what its points cost."""

    request: CompressRequest
    device: torch.device
    progress: Progress
    world: World
    trace: RunTrace
    calibration: CalibrationSet | None = None
    pruned: Pruned | None = None
    results: list[StageResult] = field(default_factory=list)
    device_peaks: DevicePeaks = field(default_factory=DevicePeaks)
    written_report: CompressionReport | None = None
    #: keep resume points (a streamed single-stage run), and the interrupted run to continue
    resumable: bool = False
    unfinished: Unfinished | None = None
    resume: ResumeStats | None = None

    def calibration_set(self, model: torch.nn.Module) -> CalibrationSet:
        """The calibration rows, loaded once for every stage: media rows through the model's
        own processor, texts through its tokenizer, token ids as they are; every id checked
        against the embedding table. Under torchrun every rank loads them together, and a
        rank that cannot ends every rank with its error (:meth:`World.agree`)."""
        if self.calibration is None:
            self.calibration = self.world.agree(lambda: self._load_calibration(model))
        return self.calibration

    def _load_calibration(self, model: torch.nn.Module) -> CalibrationSet:
        request, settings = self.request, self.request.calibration
        assert settings.dataset is not None  # a request has a dataset
        sizes = {
            "samples": settings.samples,
            "seq_len": settings.seq_len,
            "seed": settings.seed,
            "batch_size": settings.batch_size,
            "vocab_size": model.get_input_embeddings().num_embeddings,
        }
        if request.modality != "text":
            assert request.source.folder is not None  # a request has weights
            return load_multimodal_calibration(
                settings.dataset, request.source.folder, modality=request.modality,
                columns=settings.columns(), **sizes,
            )  # fmt: skip
        tokenizer = _tokenizer(request.source) if request.data_kind != "npy" else None
        return load_calibration(
            settings.dataset, tokenizer, column=settings.text_column,
            text_lists=settings.text_lists, **sizes,
        )  # fmt: skip

    def report(
        self, stages: list[tuple[Stage, list[LayerResult]]], dtype: torch.dtype | None
    ) -> CompressionReport:
        """The report of ``stages`` as they ran, with their compressed layers."""
        assert dtype is not None  # loading refuses a model without floating-point weights
        return build_report(
            self.request,
            stages,
            self.trace.traced,
            device=self.device,
            dtype=dtype,
            device_peak_bytes=self.device_peaks.current(self.device),
            calibration=self.calibration,
        )


def _tokenizer(source: ModelSource) -> Any:
    if not source.has_tokenizer:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.folder)
