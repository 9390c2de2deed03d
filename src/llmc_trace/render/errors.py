"""Errors of rendering, each with the hint that fixes it."""

from __future__ import annotations

from llmc_trace.errors import LlmcTraceError

INSTALL_GRAPHVIZ = (
    "Install Graphviz, which provides `dot`: `apt-get install -y graphviz` on Debian or Ubuntu, "
    "`brew install graphviz` on macOS, `conda install graphviz` in conda; then check `dot -V`."
)


class DotNotFoundError(LlmcTraceError):
    """Graphviz's ``dot``, which lays out every view, is not on ``PATH``."""

    def __init__(self) -> None:
        super().__init__("Graphviz's `dot` program was not found on PATH.", hint=INSTALL_GRAPHVIZ)


class LayoutError(LlmcTraceError):
    """``dot`` ran but rejected the graph or crashed; a bug of ours or of Graphviz."""


class NotTraceableError(LlmcTraceError):
    """The view needs a traced model, and this model did not trace."""
