"""Resume an interrupted ``compress`` run after the last subgraph it finished.

A streamed sequential or layer-sequential run writes each subgraph's compressed tensors into
its staging folder (``.<out>.<tag>.partial``) as soon as the subgraph is done. After each
subgraph it also keeps, under the folder's ``resume/``, what the rest of the run needs to
continue exactly as if it had not stopped: every rank's pipeline state (the activations
entering the next subgraph), its compressor's results so far and its random state
(``rank<r>-<k>.pt``, saved whole and renamed into place), and ``manifest.json``: the
subgraphs finished, the tensors the shards hold, and what the run was (:func:`fingerprint`:
the request's options and data, the model's files, the library versions, the ranks). The
manifest is written last, after every rank's state and the shards are flushed, so it never
names a state that is not complete on disk.

A later run of the same command (or any with ``--resume``) that finds such a folder beside
its ``--out`` (:func:`settle_staging`, under the output's lock, so the folder's writer is
dead) continues from it: the finished subgraphs are skipped, their tensors already in the
shards, and the checkpoint comes out byte for byte as an uninterrupted run's. A run whose
fingerprint differs is refused, saying what differs; ``--overwrite`` removes the folder
instead. A folder without a manifest (killed before its first subgraph was done) is removed,
named in a warning. The state is removed before the checkpoint is renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmc_trace.checkpoint.writer import RESUME_FOLDER, CheckpointWriter, WriterProgress
from llmc_trace.core.world import World
from llmc_trace.errors import BadInputError
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.spec.recipe import installed_versions, render_recipe
from llmc_trace.oneshot.request import CompressRequest
from llmc_trace.oneshot.result import ResumeStats

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
#: Test hook: a run whose environment sets this to ``k`` kills itself (SIGKILL, every rank)
#: right after its resume point for ``k`` finished subgraphs is complete, as a preempted
#: machine would. The resume tests use it to stop a run at an exact subgraph.
KILL_AFTER = "LLMC_TRACE_TEST_KILL_AFTER_SUBGRAPH"
_SAMPLED = 4 << 20
"""Bytes read from each end of a file larger than twice this for its digest."""


@dataclass(frozen=True)
class Unfinished:
    """An interrupted run's staging folder and its manifest, to continue."""

    staging: Path
    manifest: dict[str, Any]

    @property
    def finished(self) -> int:
        return int(self.manifest["finished"])

    @property
    def pipeline(self) -> str:
        return str(self.manifest["pipeline"])

    def writer_progress(self) -> WriterProgress:
        m = self.manifest
        return WriterProgress(self.staging, list(m["written"]), m["zeros"], m["counted"])


def fingerprint(request: CompressRequest, world: World) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one: the library versions, the
    model's files and the request (every option, the dataset's bytes, the number of ranks).

    Files up to 8 MiB are hashed whole; larger ones (weight shards) by their size and their
    first and last 4 MiB, which holds each shard's header (every tensor's name, dtype, shape
    and offset): a full hash of a 400B model's shards would take longer than many runs.
    """
    assert request.source.folder is not None  # a request has weights
    folder = Path(request.source.folder)
    files = {
        path.name: _digest(path)
        for path in sorted(folder.iterdir())
        if path.is_file() and not path.name.startswith(".")
    }
    recipe = render_recipe(request.recipe())
    dataset = Path(str(request.calibration.dataset))
    data = _digest(dataset) if dataset.is_file() else str(request.calibration.dataset)
    key = json.dumps([recipe, request.modality, data, world.size])
    return {
        "versions": {name: value for name, value in installed_versions().items()},
        "model_files": files,
        "request": hashlib.sha256(key.encode()).hexdigest(),
    }


def _digest(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        if size <= 2 * _SAMPLED:
            digest.update(handle.read())
        else:
            digest.update(handle.read(_SAMPLED))
            handle.seek(size - _SAMPLED)
            digest.update(handle.read(_SAMPLED))
    return digest.hexdigest()


def _difference(found: dict[str, Any], ours: dict[str, Any]) -> str | None:
    """What differs between an interrupted run's fingerprint and ours, in words."""
    for name, value in ours["versions"].items():
        if found["versions"].get(name) != value:
            return f"{name} is {value}, the interrupted run's was {found['versions'].get(name)}"
    files, theirs = ours["model_files"], found["model_files"]
    for name in sorted(set(files) | set(theirs)):
        if files.get(name) != theirs.get(name):
            return f"the model's {name} is not the file the interrupted run read"
    if found["request"] != ours["request"]:
        return "its options, dataset or number of ranks differ from this command's"
    return None


def staging_folders(out: Path) -> list[Path]:
    """The staging folders of earlier runs writing ``out``, oldest first."""
    if not out.parent.is_dir():
        return []
    found = [p for p in out.parent.glob(f".{out.name}.*.partial") if p.is_dir()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _stage_folders(out: Path) -> list[Path]:
    """The hidden folders a run of several stages writes its earlier stages' models into
    (``.<out>.stage<i>.<tag>``, and their own staging folders), left by a killed run."""
    if not out.parent.is_dir():
        return []
    found = [*out.parent.glob(f".{out.name}.stage*"), *out.parent.glob(f"..{out.name}.stage*")]
    return sorted(p for p in found if p.is_dir())


def read_manifest(staging: Path) -> dict[str, Any] | None:
    """The resume manifest of ``staging``; ``None`` when it has none that can be read."""
    try:
        manifest = json.loads((staging / RESUME_FOLDER / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def settle_staging(
    request: CompressRequest, world: World, *, resume: bool, resumable: bool
) -> Unfinished | None:
    """Decide, on rank 0 with ``--out``'s lock held, what becomes of every staging folder a
    dead run left beside ``--out``; every rank gets the run to continue (``None``: start
    afresh). Bad input when ``resume`` is asked and nothing matching is there, or when an
    unfinished run of another request is there and neither ``--overwrite`` nor ``resume``
    says what to do."""
    decision: Unfinished | BadInputError | None = None
    if world.is_main:
        try:
            decision = _settle(request, world, resume=resume, resumable=resumable)
        except BadInputError as err:
            err.shown_by_rank_0 = world.distributed
            decision = err
    decision = world.broadcast_object(decision, src=0)
    if isinstance(decision, BadInputError):
        raise decision
    return decision


def _settle(
    request: CompressRequest, world: World, *, resume: bool, resumable: bool
) -> Unfinished | None:
    out = request.out_path
    assert out is not None
    for folder in _stage_folders(out):
        _remove(folder, "an earlier stage's model, which every run makes afresh")
    ours: dict[str, Any] | None = None
    chosen: Unfinished | None = None
    refusal: str | None = None
    for staging in reversed(staging_folders(out)):  # the newest first
        manifest = read_manifest(staging)
        if manifest is None or not manifest.get("finished"):
            _remove(staging, "it finished no subgraph, so nothing in it can be resumed")
            continue
        if chosen is not None or (request.overwrite and not resume):
            _remove(staging, "--overwrite starts afresh" if chosen is None else "older")
            continue
        if resumable and ours is None:
            ours = fingerprint(request, world)
        difference = (
            "this run keeps no resume points (several stages, or --no-resumable)"
            if ours is None
            else _difference(manifest["fingerprint"], ours)
        )
        if difference is None:
            chosen = Unfinished(staging, manifest)
            logger.warning(
                "resuming the interrupted run in %s after subgraph %d (%s); subgraphs 1-%d "
                "are not run again",
                staging, chosen.finished, chosen.pipeline, chosen.finished,
            )  # fmt: skip
        elif refusal is None:
            refusal = f"{staging} holds an unfinished run that cannot be resumed here: {difference}"
    if chosen is None and refusal is not None:
        raise BadInputError(
            f"{refusal}.",
            hint="Run the interrupted command again to resume it, or pass --overwrite to "
            "remove it and start afresh.",
            param="out",
        )
    if chosen is None and resume:
        raise BadInputError(
            f"--resume found no unfinished run of {out} to continue.",
            hint="Leave out --resume to start the run.",
            param="resume",
        )
    return chosen


def _remove(staging: Path, why: str) -> None:
    logger.warning("removing %s, left by a run that was killed while writing (%s)", staging, why)
    shutil.rmtree(staging, ignore_errors=True)


class RunResume:
    """The resume points of one streamed stage (:class:`~llmc_trace.pipelines.resume.
    ResumePoints`): each rank's state in ``staging/resume``, the manifest from rank 0, which
    alone holds ``writer``."""

    def __init__(
        self,
        staging: Path,
        fingerprint: dict[str, Any],
        world: World,
        compressor: LayerCompressor,
        writer: CheckpointWriter | None,
        unfinished: Unfinished | None,
    ) -> None:
        self.folder = staging / RESUME_FOLDER
        self.fingerprint = fingerprint
        self.world = world
        self.compressor = compressor
        self.writer = writer
        self.unfinished = unfinished
        self.pipeline: str | None = None
        #: subgraphs the interrupted run had finished, skipped here
        self.skipped = 0
        self._saves = self._bytes = self._peak = 0
        self._seconds = 0.0
        self.folder.mkdir(parents=True, exist_ok=True)
        if writer is not None:
            writer.keep_on_interrupt = unfinished is not None

    def start(self, pipeline: str) -> int:
        self.pipeline = pipeline
        if self.unfinished is None or self.unfinished.pipeline != pipeline:
            return 0
        self.skipped = self.unfinished.finished
        return self.skipped

    def restore(self) -> Any:
        """The pipeline's state, with the compressor's results and the random state restored."""
        assert self.unfinished is not None
        path = self._state(self.world.rank, self.unfinished.finished)
        saved = torch.load(path, map_location="cpu", weights_only=False)
        self.compressor.results[:] = saved["results"]
        self.compressor.quantized.update(saved["quantized"])
        torch.set_rng_state(saved["rng"])
        return saved["pipeline"]

    def save(self, finished: int, state: Any) -> None:
        """Keep this rank's state for ``finished`` subgraphs, then (rank 0, once every rank
        has) the manifest naming it; the previous point is removed afterwards."""
        began = time.perf_counter()
        saved = {
            "pipeline": state,
            "results": list(self.compressor.results),
            "quantized": dict(self.compressor.quantized),
            "rng": torch.get_rng_state(),
        }
        path = self._state(self.world.rank, finished)
        temporary = path.with_suffix(".tmp")
        torch.save(saved, temporary)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        self._bytes += path.stat().st_size
        self.world.barrier()  # every rank's state is on disk before the manifest names it
        if self.writer is not None:
            progress = self.writer.progress()
            manifest = {
                "format": FORMAT,
                "fingerprint": self.fingerprint,
                "pipeline": self.pipeline,
                "finished": finished,
                "ranks": self.world.size,
                "written": progress.written,
                "zeros": progress.zeros,
                "counted": progress.counted,
            }
            temporary = self.folder / f"{MANIFEST}.tmp"
            temporary.write_text(json.dumps(manifest))
            self._bytes += temporary.stat().st_size
            os.replace(temporary, self.folder / MANIFEST)
            self.writer.keep_on_interrupt = True
            self._peak = max(self._peak, self.size_bytes())
            for rank in range(self.world.size):
                self._state(rank, finished - 1).unlink(missing_ok=True)
        self.world.barrier()
        self._saves += 1
        self._seconds += time.perf_counter() - began
        if os.environ.get(KILL_AFTER) == str(finished):
            os.kill(os.getpid(), signal.SIGKILL)

    def _state(self, rank: int, finished: int) -> Path:
        return self.folder / f"rank{rank}-{finished}.pt"

    def stats(self) -> ResumeStats:
        """What the run's resume points cost (bytes: this rank's states, and on rank 0 the
        manifests and the largest the folder was, every rank's states together)."""
        return ResumeStats(self.skipped, self._saves, self._bytes, self._seconds, self._peak)

    def size_bytes(self) -> int:
        """Bytes the resume point takes on disk now (every rank's state and the manifest)."""
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())
