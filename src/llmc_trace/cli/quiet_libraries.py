"""Keep the libraries' own chatter off a command's display.

A command draws its progress on stderr with rich; a tqdm bar printed by transformers (loading
weights) or compressed-tensors (applying a checkpoint's quantization config, dispatching its
modules, decompressing) cuts through it; transformers' advice about optional kernels, and its
deprecation warnings (raised by its own code: Fuyu's model sets the ``rope_scaling`` it
deprecates), say nothing a user of llmc-trace can act on.
"""

from __future__ import annotations

import os
import warnings
from typing import Any


def quiet_libraries() -> None:
    """Silence transformers' advice and deprecation warnings and every tqdm bar, unless the
    user's environment asks for them (``TRANSFORMERS_VERBOSITY``, an empty ``TQDM_DISABLE=``).

    Both variables are read when their library is first imported, which no command has done
    yet. ``TQDM_DISABLE`` is read as tqdm reads it (any value but an empty one disables), but
    only sets tqdm's default, and compressed-tensors passes ``disable=False`` explicitly, so
    tqdm itself is told to draw nothing as well; importing it costs about 40 ms, against the
    seconds of torch's import every command that loads a model pays.
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if os.environ["TRANSFORMERS_VERBOSITY"] == "error":
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=r"transformers(\.|$)")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if os.environ["TQDM_DISABLE"]:
        _disable_every_tqdm_bar()


def _disable_every_tqdm_bar() -> None:
    """Make every tqdm bar (its subclasses too: ``tqdm.auto``, transformers' wrapper) a
    disabled one, whatever its caller passes. Idempotent: a second command in the same
    process (the tests' runner) finds it done."""
    from tqdm import std

    original = std.tqdm.__init__
    if getattr(original, "_llmc_trace_disabled", False):
        return

    def disabled(self: std.tqdm, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        original(self, *args, **kwargs)

    disabled._llmc_trace_disabled = True  # type: ignore[attr-defined]
    std.tqdm.__init__ = disabled  # type: ignore[method-assign]
