"""Errors raised by compression and checkpoint writing, each with a hint the user can act on."""

from __future__ import annotations

from llmc_trace.errors import BadInputError, LlmcTraceError


class CompressionError(LlmcTraceError):
    """Base of the errors raised by `compress/` and `checkpoint/`.

    Carries structured fields so that the CLI and `--json` can show them without parsing the
    message: `location` names where the problem is (a module path, a scheme name, a folder)
    and `hint` says what to do about it.
    """

    def __init__(self, message: str, *, hint: str, location: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.location = location

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}{self.message} Hint: {self.hint}"


class SchemeError(CompressionError, BadInputError):
    """A quantization scheme or its arguments cannot be used as given (bad input: exit 2)."""

    def __init__(self, message: str, *, hint: str, location: str | None = None) -> None:
        super().__init__(message, hint=hint, location=location)
        self.param = "scheme"


class HessianError(CompressionError, ArithmeticError):
    """The layer's Hessian could not be factorised even with raised damping."""


class CheckpointError(CompressionError, ValueError):
    """The quantized modules and the scheme(s) do not describe a loadable checkpoint."""
