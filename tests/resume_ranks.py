"""Run by ``tests/test_resume.py`` under ``torchrun --nproc-per-node 2``: on every rank, an
uninterrupted run into ``BASE/full``, a run into ``BASE/out`` stopped after subgraph 2 (the
resume module's test hook, which would SIGKILL, raises an exception nothing catches on every
rank instead), and the same request again, which resumes it. Rank 0 prints what it skipped;
the test compares the two checkpoints' bytes.

Usage: ``torchrun --nproc-per-node 2 tests/resume_ranks.py MODEL DATA BASE``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmc_trace.core.world import joined_from_environment
from llmc_trace.oneshot import CompressRequest, compress
from llmc_trace.oneshot.resume import KILL_AFTER


class Killed(BaseException):
    """Where the hook would kill the rank."""


def _kill(pid: int, signum: int) -> None:
    raise Killed


def main(model: str, data: str, base: str) -> None:
    settings = dict(samples=4, seq_len=32, batch_size=1, group_size=32)
    with joined_from_environment() as world:
        compress(CompressRequest(model, data, Path(base) / "full", **settings))
        kill, os.kill = os.kill, _kill
        os.environ[KILL_AFTER] = "2"
        try:
            compress(CompressRequest(model, data, Path(base) / "out", **settings))
        except Killed:
            pass
        else:
            raise AssertionError("the run was not stopped after subgraph 2")
        finally:
            os.kill = kill
            del os.environ[KILL_AFTER]
        resumed = compress(CompressRequest(model, data, Path(base) / "out", **settings))
        assert resumed.resume is not None
        if world.is_main:
            print(f"skipped {resumed.resume.skipped} of {world.size} ranks' run")


if __name__ == "__main__":
    main(*sys.argv[1:])
