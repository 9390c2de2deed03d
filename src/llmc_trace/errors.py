"""Every error llmc-trace raises on purpose, in one hierarchy.

The CLI turns :class:`BadInputError` into exit code 2 and any other :class:`LlmcTraceError`
into exit code 1, printing ``message`` and ``hint``; a traceback appears only with ``--debug``.
Each error carries structured fields (``hint``, ``param``, ``location``, ``source``) so the CLI
and ``--json`` show them without parsing the message.

:class:`TraceStopped` is the one exception here that is not an :class:`LlmcTraceError`: it is
a finding about the model (its code could not be traced), which
:mod:`llmc_trace.diagnose.failure` turns into a located :class:`TraceFailure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

INSTALL_GRAPHVIZ = (
    "Install Graphviz, which provides `dot`: `apt-get install -y graphviz` on Debian or Ubuntu, "
    "`brew install graphviz` on macOS, `conda install graphviz` in conda; then check `dot -V`."
)


class LlmcTraceError(Exception):
    """Base class of every error llmc-trace raises on purpose.

    ``hint`` says what to do about it; ``param`` names the offending input where there is one,
    so a command line can point at the option.
    """

    #: set on the error every rank of a distributed run raises together
    #: (:meth:`~llmc_trace.core.world.World.agree`): rank 0 shows it, the others end quietly
    shown_by_rank_0: bool = False

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


class OutputError(BadInputError):
    """The output could not be written where asked (a read-only folder, a full disk).

    The writers stage everything beside the target and rename it into place only when complete,
    so when this is raised nothing partial is left behind and a previous output is untouched.
    """

    @classmethod
    def writing(cls, target: object, err: OSError) -> OutputError:
        return cls(
            f"could not write {target}: {err.strerror or err}.",
            hint="Choose an --out on a writable disk with room for it; nothing partial was left.",
            param="out",
        )


class DataError(BadInputError):
    """A calibration source that cannot give the data asked of it.

    Every problem with a data source (a missing file, an unknown file type, no text column, too
    few samples, an unreachable Hub) is a ``DataError``; the checks that raise it run before any
    model work starts. ``source`` names the dataset or file as the user gave it (empty when no
    source was involved); ``param`` defaults to ``dataset`` when there is one (the option that
    named it).
    """

    def __init__(
        self, message: str, *, hint: str, source: str = "", param: str | None = None
    ) -> None:
        super().__init__(message, hint=hint, param=param or ("dataset" if source else None))
        self.source = source

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields need an explicit reduce to survive pickling (pytest-xdist, spawn).
        return (_rebuild_data_error, (self.message, self.hint, self.source, self.param))


def _rebuild_data_error(message: str, hint: str, source: str, param: str | None) -> DataError:
    return DataError(message, hint=hint, source=source, param=param)


class CompressionError(LlmcTraceError):
    """Base of the errors raised by ``compress/`` and ``checkpoint/``.

    ``location`` names where the problem is (a module path, a scheme name, a folder).
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


class NonFiniteError(LlmcTraceError):
    """A value computed from finite inputs holds NaN or inf: a layer's calibration inputs or
    Hessian, a compressed weight, a tensor on its way into a checkpoint, a model's logits.

    Non-finite *inputs* (source weights, token ids) are bad input and refused as such where
    they are read; this is the job's own answer going wrong (exit 1), raised where the value is
    made so that nothing downstream is built on it. ``location`` names the tensor or layer.
    """

    def __init__(self, message: str, *, hint: str, location: str) -> None:
        super().__init__(message, hint=hint)
        self.location = location


class DotNotFoundError(LlmcTraceError):
    """Graphviz's ``dot``, which lays out every view, is not on ``PATH``."""

    def __init__(self) -> None:
        super().__init__("Graphviz's `dot` program was not found on PATH.", hint=INSTALL_GRAPHVIZ)


class LayoutError(LlmcTraceError):
    """``dot`` ran but rejected the graph or crashed; a bug of ours or of Graphviz."""


class NotTraceableError(LlmcTraceError):
    """The view or pipeline needs a traced model, and this model did not trace.

    ``failure`` (a ``TraceFailure``: where and why) and ``fixes`` (the ``FixAttempt``s tried)
    are set when the caller knows them.
    """

    def __init__(
        self, message: str, *, hint: str = "", failure: Any = None, fixes: Sequence[Any] = ()
    ) -> None:
        super().__init__(message, hint=hint)
        self.failure = failure
        self.fixes = list(fixes)


class TraceStopped(Exception):
    """Tracing stopped inside model code.

    ``cause`` is what the model code raised; ``module_stack`` the ``(path, class)`` of every
    module being traced when it was raised, outermost first; ``partial_graph`` the graph
    recorded up to that point (a ``torch.fx.Graph``, for the failure view), when there is one;
    ``leaves`` the trace's leaf plan (a ``LeafPlan``), which the views draw a failure with;
    ``decisions`` the branches model code took up to there (``Decision`` objects).
    """

    def __init__(
        self,
        cause: BaseException,
        module_stack: list[tuple[str, str]],
        partial_graph: Any,
        leaves: Any,
    ) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.module_stack = module_stack
        self.partial_graph = partial_graph
        self.leaves = leaves
        self.decisions: list[Any] = []
