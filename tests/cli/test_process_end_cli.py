"""The console script ends its process once the command is done, skipping only the
interpreter's teardown: the threads, the exit handlers, the output and the status are what
Python's own exit leaves."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: A process that holds what an exit must finish (a thread still working, an exit handler)
#: and an object whose finalizer only the interpreter's teardown would run, then runs the
#: console script with the arguments it is given.
SCRIPT = """
import atexit, sys, threading, time
atexit.register(lambda: print("exit handler ran", flush=True))
class Held:
    def __del__(self):
        print("torn down", flush=True)
held = Held()
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
from llmc_trace.cli.main import main
sys.argv = ["llmc-trace", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    ("arguments", "status", "said"),
    [(["--version"], 0, "llmc-trace, version"), (["no-such-command"], 2, "No such command")],
)
def test_the_command_ends_after_its_threads_and_exit_handlers_without_the_teardown(
    arguments: list[str], status: int, said: str
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", SCRIPT, *arguments], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == status, child.stderr
    assert said in child.stdout + child.stderr  # buffered output to a pipe is delivered
    out = child.stdout
    assert out.index("thread finished") < out.index("exit handler ran")  # as Python's exit
    assert "torn down" not in out  # the teardown is what is skipped


@pytest.mark.parametrize(
    ("code", "status", "printed"), [(None, 0, ""), ("it broke", 1, "it broke")]
)
def test_a_status_is_read_as_system_exit_reads_it(
    code: str | None, status: int, printed: str
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", f"from llmc_trace.cli.ending import end_process; end_process({code!r})"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (child.returncode, child.stderr.strip()) == (status, printed)
