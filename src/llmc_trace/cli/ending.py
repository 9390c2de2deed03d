"""End the ``llmc-trace`` process once its command is done, without the interpreter's teardown.

A command imports torch and transformers: some 400,000 Python objects. After the command has
printed its last line, Python's own exit frees them one by one in its final garbage
collections, 1.5-3 s of CPU on every command while the prompt waits (and while a torchrun rank
holds its slot). :func:`end_process` does what an exit must do first, in the order Python's
exit does it: it joins the threads not marked daemon, runs the exit handlers the libraries
registered (logging's last flush, file locks released, temporary folders removed, child
processes joined) and flushes the standard streams; then ``os._exit`` ends the process with
the command's status, and only the teardown is skipped.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def end_process(code: object) -> NoReturn:
    """Exit with ``code`` read as ``SystemExit`` reads it (``None`` is 0, an integer is the
    status, anything else is printed to stderr and gives 1), skipping the teardown."""
    status = _status(code)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone or a stream closed: nothing to deliver
            pass
    os._exit(status)


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
