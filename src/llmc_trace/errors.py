"""Project error types: every failure a user can act on carries a hint.

The CLI turns :class:`BadInputError` into exit code 2 and any other :class:`LlmcTraceError`
into exit code 1, printing ``message`` and ``hint``; a traceback appears only with ``--debug``.
"""

from __future__ import annotations


class LlmcTraceError(Exception):
    """Base class of every error llmc-trace raises on purpose.

    ``hint`` says what to do about it; ``param`` names the offending input where there is one,
    so a command line can point at the option.
    """

    def __init__(self, message: str, *, hint: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.param = param

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()


class BadInputError(LlmcTraceError, ValueError):
    """The user asked for something that cannot work (unknown model, target matching nothing...).

    Raised before heavy work starts, so nothing is half done.
    """


class VerificationError(LlmcTraceError):
    """Running the subgraphs in order did not reproduce the model's output."""
