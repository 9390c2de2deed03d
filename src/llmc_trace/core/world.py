"""The processes one calibration runs on: a ``torch.distributed`` process group, or this one.

``torchrun --nproc-per-node N --no-python llmc-trace compress ...`` starts N ranks; each joins
the group (:func:`joined_from_environment`: NCCL on GPUs, gloo on CPUs), takes every N-th
calibration batch, and runs the pipeline on its own batches with its own cache. What the ranks
must agree on goes through the group: each Hessian is summed over the ranks before any solve,
the solves are shared out by cost, and each result is broadcast from the rank that computed it,
so every rank continues with the same compressed weights. Rank 0 alone writes the checkpoint
and shows progress.

A process that is not part of a group is a world of one: every method here is then free.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from llmc_trace.errors import BadInputError, LlmcTraceError

T = TypeVar("T")

#: How long a collective waits for a rank that neither answers nor fails (a hung rank).
TIMEOUT = timedelta(seconds=int(os.environ.get("LLMC_TRACE_DIST_TIMEOUT", "600")))


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` ranks (``size == 1``: no process group)."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def device(self) -> torch.device:
        """Where this rank computes: its own GPU under NCCL, else the CPU."""
        if self.distributed and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share: every ``size``-th item from its rank on (disjoint, deterministic,
        and the shares differ in length by at most one)."""
        return list(items[self.rank :: self.size])

    def owners(self, costs: Sequence[float]) -> list[int]:
        """The rank that does each job: longest first, each to the least loaded rank, ties to
        the lowest rank; the same answer on every rank."""
        load = [0.0] * self.size
        owner = [0] * len(costs)
        for job in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
            rank = min(range(self.size), key=lambda r: (load[r], r))
            owner[job] = rank
            load[rank] += costs[job]
        return owner

    def sum_mean(self, mean: torch.Tensor, count: int) -> int:
        """Turn this rank's ``mean`` over ``count`` items into the mean over every rank's items,
        in place; returns the total count."""
        if not self.distributed:
            return count
        total = torch.tensor([float(count)], dtype=torch.float64, device=self._comm(mean))
        dist.all_reduce(total)
        moved = mean.to(self._comm(mean))
        moved.mul_(count)
        dist.all_reduce(moved)
        if total.item() > 0:  # no rank saw an item (an expert no token was routed to): zeros
            moved.div_(total.item())
        if moved is not mean:
            mean.copy_(moved)
        return int(total.item())

    def broadcast(self, tensors: list[torch.Tensor], src: int) -> None:
        """Give every rank ``src``'s values of ``tensors`` (same shapes and dtypes on each),
        in place."""
        if not self.distributed:
            return
        for tensor in tensors:
            moved = tensor.to(self._comm(tensor))
            dist.broadcast(moved, src)
            if moved is not tensor:
                tensor.copy_(moved)

    def broadcast_object(self, value: T, src: int) -> T:
        if not self.distributed:
            return value
        box: list[object] = [value]
        dist.broadcast_object_list(box, src)
        return box[0]  # type: ignore[return-value]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def agree(self, step: Callable[[], T]) -> T:
        """``step()`` run on every rank, its project error on any rank raised on every rank.

        A rank that cannot do its part (read its dataset) would otherwise end alone, and the
        others wait in their next collective until torchrun kills them, each printing a
        traceback about a closed connection. Here every rank learns of the failure at once
        and raises it: rank 0 names the rank (``rank 1: ...``) and the CLI shows it there
        alone (``shown_by_rank_0``), with the failing rank's exit code.
        """
        try:
            value = step()
        except LlmcTraceError as err:
            if self.distributed:
                self._end_together(err)
            raise
        if self.distributed:
            self._end_together(None)
        return value

    def _end_together(self, failure: LlmcTraceError | None) -> None:
        """Tell every rank how this one's step ended (``failure``), and raise on every rank
        the error of the first rank that failed; return when none did."""
        reports: list[tuple[bool, str, str, str | None] | None] = [None] * self.size
        dist.all_gather_object(reports, None if failure is None else _report(failure))
        failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
        if not failed:
            return
        rank, (bad_input, message, hint, param) = failed[0]
        if rank == self.rank and failure is not None:
            error = failure
        else:
            kind = BadInputError if bad_input else LlmcTraceError
            error = kind(f"rank {rank}: {message}", hint=hint, param=param)
        error.shown_by_rank_0 = True
        raise error

    def _comm(self, tensor: torch.Tensor) -> torch.device:
        """Where a collective on ``tensor`` runs: NCCL needs the rank's GPU, gloo the CPU or
        the tensor's own device."""
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def _report(error: LlmcTraceError) -> tuple[bool, str, str, str | None]:
    """What another rank needs to raise ``error`` as its own: its kind (bad input or not),
    message, hint and parameter."""
    return isinstance(error, BadInputError), error.message, error.hint, error.param


def current_world() -> World:
    """The process group this process belongs to, or a world of one."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


@contextlib.contextmanager
def joined_from_environment() -> Iterator[World]:
    """This process's rank in the group ``torchrun`` describes in the environment
    (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``...), for the ``with`` block; NCCL with one GPU
    per local rank when there are GPUs, gloo otherwise. Without those variables, a world of one.

    The group joined here is left when the block ends, however it ends (an error every rank
    raised together included): a process that exits still in a gloo group can abort in its
    exit handlers ("terminate called without an active exception", SIGABRT) instead of
    ending with its own exit code.
    """
    joins = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
    if joins:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=TIMEOUT)
        # torchrun stops the other ranks with SIGTERM when one fails: exit through the normal
        # unwinding, so a partial checkpoint folder is removed, not left behind
        signal.signal(signal.SIGTERM, _stop)
    try:
        yield current_world()
    finally:
        if joins and dist.is_initialized():
            dist.destroy_process_group()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(
        f"rank {current_world().rank}: stopped by torchrun (another rank failed; its error is "
        "above)"
    )


def check_shareable(world: World, batches: int, needs_data: bool) -> None:
    """Ranks help only a calibration that has data to share, and enough of it."""
    if not world.distributed:
        return
    if not needs_data:
        raise BadInputError(
            f"{world.size} ranks were started for a method that needs no calibration data; "
            "there is nothing to share between them.",
            hint="Run round-to-nearest or magnitude pruning in one process (no torchrun).",
            param="method",
        )
    if batches < world.size:
        raise BadInputError(
            f"{batches} calibration batches cannot be shared by {world.size} ranks.",
            hint=f"Use at least {world.size} batches (--samples / --batch-size), or fewer ranks.",
            param="samples",
        )
