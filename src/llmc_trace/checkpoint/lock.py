"""One writer per output folder: an advisory lock beside ``--out``, held for a whole run.

Two ``compress`` runs writing to the same ``--out`` would each stage a checkpoint and rename
it into place, the second silently replacing the first, and each would take the other's
unfinished staging folder for a dead run's. The lock (``fcntl.flock`` on ``.<out>.lock``, a
file beside the output holding the holder's pid) makes the second stop before any work,
naming the first. The kernel drops it when its process ends however it ends (SIGKILL, the
OOM killer), so a lock file whose lock nobody holds marks a dead run, never a live one.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmc_trace.errors import BadInputError, OutputError


def lock_path(out: Path) -> Path:
    """The lock file of the output folder ``out``."""
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock until the block ends; another live holder is bad input naming its
    pid. The file is removed on release (a later run re-creates it)."""
    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = _locked(path, out)
    except OSError as err:
        raise OutputError.writing(path, err) from err
    try:
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(descriptor)


def _locked(path: Path, out: Path) -> int:
    """A descriptor of ``path`` holding its exclusive lock. A file removed by its last holder
    between our open and our lock is not the lock any more: open it again."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise BadInputError(
                f"another compress run (pid {holder}) is writing to {out}.",
                hint="Wait for it to end, or choose another --out.",
                param="out",
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return descriptor
        os.close(descriptor)
