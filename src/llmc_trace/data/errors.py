"""The one error that calibration-data loading raises for bad input.

Every problem with a data source (a missing file, an unknown file type, no text column, too few
samples, an unreachable Hub) is a `DataError`. It is a `BadInputError`, which the command line
turns into exit code 2 with the message and the hint; the checks that raise it run before any
model work starts, so nothing is half done.
"""

from __future__ import annotations

from llmc_trace.errors import BadInputError


class DataError(BadInputError):
    """A calibration source that cannot give the data asked of it.

    `message` is one sentence; `hint` says what the user can do about it; `source` names the
    dataset or file as the user gave it (empty when no source was involved), and `param` the
    offending argument where it is one (`"samples"`, `"seq_len"`, ...). Through
    `BadInputError` it is also a `ValueError`, so callers not aware of the project still catch
    it as bad input.
    """

    def __init__(
        self, message: str, *, hint: str, source: str = "", param: str | None = None
    ) -> None:
        super().__init__(message, hint=hint, param=param)
        self.source = source

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields need an explicit reduce to survive pickling (pytest-xdist, spawn).
        return (_rebuild, (self.message, self.hint, self.source, self.param))


def _rebuild(message: str, hint: str, source: str, param: str | None) -> DataError:
    return DataError(message, hint=hint, source=source, param=param)
