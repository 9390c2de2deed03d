"""What the stages of one ``compress`` run share: the request, where it runs, and what an
earlier stage leaves for the later ones (the calibration rows, the trace, the pruning mask)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmc_trace.core.device_peak import DevicePeaks
from llmc_trace.core.progress import Progress
from llmc_trace.core.world import World
from llmc_trace.data import CalibrationSet, load_calibration
from llmc_trace.data.multimodal import load_multimodal_calibration
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.result import Pruned
from llmc_trace.oneshot.resume import Unfinished
from llmc_trace.oneshot.settle import RunTrace


#: Tokens in each row of the batch a data-free run traces on: its stages run no data, the
#: trace only places each layer in its subgraph for the plan and the report.
TRACING_TOKENS = 16


def tracing_batch(vocab_size: int, batch_size: int, seed: int) -> CalibrationSet:
    """Token ids drawn from the vocabulary, one batch to trace on, where no dataset is given."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch_size, TRACING_TOKENS), generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return CalibrationSet([batch], batch_size, TRACING_TOKENS, ids.numel(), "drawn tokens", seed)


class CalibrationRows:
    """The calibration rows, loaded when the first stage asks and kept for the others."""

    def __init__(self) -> None:
        self.loaded: CalibrationSet | None = None


@dataclass(frozen=True)
class RunContext:
    """The request, where it runs, and what its stages share: the calibration rows (loaded
    once), the settled trace, the device peaks; whether the run keeps resume points and the
    interrupted run it continues; ``pruned``: the mask an earlier stage left (the driver
    hands each stage a context with the one before it left)."""

    request: CompressRequest
    device: torch.device
    progress: Progress
    world: World
    trace: RunTrace
    #: keep resume points (a streamed single-stage run), and the interrupted run to continue
    resumable: bool = False
    unfinished: Unfinished | None = None
    pruned: Pruned | None = None
    device_peaks: DevicePeaks = field(default_factory=DevicePeaks)
    rows: CalibrationRows = field(default_factory=CalibrationRows)

    @property
    def calibration(self) -> CalibrationSet | None:
        """The calibration rows, once a stage has loaded them (``None`` before, or without)."""
        return self.rows.loaded

    def calibration_set(self, model: torch.nn.Module) -> CalibrationSet:
        """The calibration rows, loaded once for every stage: media rows through the model's
        own processor, texts through its tokenizer, token ids as they are; every id checked
        against the embedding table. Under torchrun every rank loads them together, and a
        rank that cannot ends every rank with its error (:meth:`World.agree`)."""
        if self.rows.loaded is None:
            self.rows.loaded = self.world.agree(lambda: self._load_calibration(model))
        return self.rows.loaded

    def _load_calibration(self, model: torch.nn.Module) -> CalibrationSet:
        request, settings = self.request, self.request.calibration
        vocab_size = model.get_input_embeddings().num_embeddings
        if settings.dataset is None:  # data-free stages only (the request checked)
            return tracing_batch(vocab_size, settings.batch_size, settings.seed)
        sizes = {
            "samples": settings.samples,
            "seq_len": settings.seq_len,
            "seed": settings.seed,
            "batch_size": settings.batch_size,
            "vocab_size": vocab_size,
        }
        if request.modality != "text":
            assert request.source.folder is not None  # a request has weights
            return load_multimodal_calibration(
                settings.dataset, request.source.folder, modality=request.modality,
                columns=settings.columns(), **sizes,
            )  # fmt: skip
        return load_calibration(
            settings.dataset, request.tokenizer, column=settings.text_column,
            text_lists=settings.text_lists, **sizes,
        )  # fmt: skip
