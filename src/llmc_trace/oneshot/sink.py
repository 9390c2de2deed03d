"""Where a stage's calibrated weights go: left in the loaded model, or streamed into a
checkpoint folder (with a resume point after each subgraph) that is renamed into place with
its recipe and report when the run commits it.

A sink owns the stage's residency (what a pipeline calls around each group of modules:
:mod:`llmc_trace.pipelines.residency`) and, streamed, the checkpoint writer. The stage opens
it once its layers are known (:meth:`Sink.open`), calibrates through what it returns, and
finishes it (:meth:`Sink.finish`); the driver, which alone holds every stage's result, commits
it with the run's report and recipe (:meth:`Sink.commit`). Leaving the ``with`` block without
a commit removes a partial checkpoint (or keeps its resume point, when interrupted).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import torch

from llmc_trace.checkpoint.writer import CheckpointWriter, assign_schemes
from llmc_trace.core.device import HOST
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.oneshot.record import report_files
from llmc_trace.oneshot.result import Pruned, ResumeStats
from llmc_trace.oneshot.resume import RunResume, fingerprint
from llmc_trace.spec.stage import Stage
from llmc_trace.oneshot.state import RunContext
from llmc_trace.pipelines.residency import InMemory, Residency, Streamed
from llmc_trace.pipelines.resume import ResumePoints
from llmc_trace.report.schema import CompressionReport


class Sink:
    """Weights calibrated in memory: they stay in the model (see the module docstring)."""

    #: where a streamed stage reads its weights from; ``None``: the model is loaded whole
    store: WeightStore | None = None

    def __init__(self) -> None:
        #: what keeping resume points cost, once finished (``None``: none were kept)
        self.resume: ResumeStats | None = None

    def __enter__(self) -> Sink:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        return None

    def open(
        self,
        model: torch.nn.Module,
        stage: Stage,
        compressor: LayerCompressor,
        targets: list[str],
        pruned: Pruned | None,
        *,
        storage: torch.dtype,
        compute: torch.dtype,
    ) -> tuple[Residency, ResumePoints | None]:
        """The residency a stage calibrates ``model`` through, and its resume points."""
        return InMemory(HOST, compute), None

    def finish(self, residency: Residency) -> None:
        """The stage has calibrated every subgraph."""

    def commit(self, report: CompressionReport | None, recipe: str | None) -> None:
        """The run is complete (``report`` and ``recipe`` are the last stage's to write)."""


class CheckpointSink(Sink):
    """Weights streamed from ``store`` into a checkpoint at ``out`` (rank 0; the other
    ranks drop what they finish). The last stage's checkpoint is quantized as its scheme
    says and carries the run's ``recipe.yaml`` and report; an earlier stage's is the dense
    model the next stage reads. A resumable run keeps a resume point after each subgraph,
    and continues ``context.unfinished`` when there is one (:mod:`~llmc_trace.oneshot.resume`)."""

    def __init__(self, context: RunContext, store: WeightStore, out: Path, *, last: bool) -> None:
        super().__init__()
        self.context, self.store, self.out, self.last = context, store, out, last
        self._held = ExitStack()
        self._writer: CheckpointWriter | None = None
        self._points: RunResume | None = None
        self._sparsity: Pruned | None = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        return self._held.__exit__(kind, error, traceback)

    def open(
        self,
        model: torch.nn.Module,
        stage: Stage,
        compressor: LayerCompressor,
        targets: list[str],
        pruned: Pruned | None,
        *,
        storage: torch.dtype,
        compute: torch.dtype,
    ) -> tuple[Residency, ResumePoints | None]:
        context, world = self.context, self.context.world
        resumable = context.resumable and self.last
        if not world.is_main:
            if resumable:
                staging = world.broadcast_object(None, src=0)
                self._points = RunResume(staging, {}, world, compressor, None, context.unfinished)
            return Streamed(model, self.store, _drop, compute), self._points
        schemes = [stage.scheme] if stage.scheme is not None and self.last else []
        self._sparsity = pruned if self.last else None
        self._writer = self._held.enter_context(
            CheckpointWriter(
                self.out,
                model,
                assign_schemes(model, targets, schemes) if schemes else {},
                compressor.quantized,
                dtype=storage,
                pruned=self._sparsity.layers if self._sparsity else (),
                max_shard_size=context.request.checkpoint.max_shard_size,
                overwrite=context.request.overwrite or not self.last,
                resume=context.unfinished.writer_progress() if context.unfinished else None,
            )
        )
        if resumable:
            world.broadcast_object(self._writer.staging, src=0)
            known = fingerprint(context.request, world)
            self._points = RunResume(
                self._writer.staging, known, world, compressor, self._writer, context.unfinished
            )
        return Streamed(model, self.store, self._writer.put, compute), self._points

    def finish(self, residency: Residency) -> None:
        self.resume = self._points.stats() if self._points is not None else None
        if self._writer is None:
            return  # another rank's: what it finished went nowhere
        residency.finish()
        self.context.progress("write", 0, 1)

    def commit(self, report: CompressionReport | None, recipe: str | None) -> None:
        if self._writer is None:
            return
        self._writer.commit(
            sparsity=self._sparsity.sparsity if self._sparsity else None,
            recipe=recipe,
            source_dir=self.store.folder,
            files=report_files(report) if report is not None else {},
        )


def _drop(name: str, tensor: torch.Tensor) -> None:
    """Where a rank other than 0 sends the tensors it finished: nowhere."""
