"""Find the line of *model* code responsible for a traced operation or a failure.

torch.fx reports failures from inside its own machinery; the user needs the line in the model
file. We walk the Python stack outward from the innermost frame and take the first frame that
belongs to neither llmc-trace, torch, nor the standard library plumbing in between.
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from dataclasses import dataclass

import torch

_TORCH_ROOT = os.path.dirname(torch.__file__) + os.sep
_LLMC_ROOT = os.path.dirname(os.path.dirname(__file__)) + os.sep
_SKIPPED_FILES = ("contextlib.py", "functools.py", "<frozen", "typing.py")


@dataclass(frozen=True)
class SourceLocation:
    """A line of model code: where an operation was recorded or where tracing failed.

    ``file`` is shown relative to its ``site-packages`` (or the working directory), so reports
    are the same on every machine; ``abs_file`` is kept for reading the source.
    """

    file: str
    line: int
    function: str
    code: str
    abs_file: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}


def display_path(path: str) -> str:
    """Shorten an absolute path to something stable across machines."""
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return os.path.basename(path)
    return relative if not relative.startswith("..") else os.path.basename(path)


def is_library_frame(filename: str) -> bool:
    """True for frames of llmc-trace, torch or plumbing, which never hold the model's code."""
    return (
        filename.startswith(_TORCH_ROOT)
        or filename.startswith(_LLMC_ROOT)
        or any(part in filename for part in _SKIPPED_FILES)
    )


def location_of_frame(frame: types.FrameType, line: int | None = None) -> SourceLocation:
    filename = frame.f_code.co_filename
    lineno = line if line is not None else frame.f_lineno
    return SourceLocation(
        file=display_path(filename),
        line=lineno,
        function=frame.f_code.co_qualname,
        code=linecache.getline(filename, lineno).strip(),
        abs_file=filename,
    )


def current_model_location() -> SourceLocation | None:
    """The innermost frame of model code on the current stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if not is_library_frame(frame.f_code.co_filename):
            return location_of_frame(frame)
        frame = frame.f_back
    return None


def model_frames_of_traceback(tb: types.TracebackType | None) -> list[SourceLocation]:
    """Every frame of model code in an exception's traceback, outermost first.

    Frames before the first library frame belong to whoever called the tracer (a script, a
    test), not to the model, and are left out.
    """
    frames: list[SourceLocation] = []
    entered = False
    while tb is not None:
        library = is_library_frame(tb.tb_frame.f_code.co_filename)
        entered = entered or library
        if entered and not library:
            frames.append(location_of_frame(tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames
