"""``TracingSettings``: how a model is traced, the one form every command and function takes.

``attempt``, ``render``, ``plan`` and ``compress`` trace a model the same way and ask the same
three things of the user: which modules are the sequential targets, how many of them one
subgraph holds, and what tracing should leave alone (``tracing_ignore``). Each is a declared
option (:mod:`~llmc_trace.core.declare`): the command line derives its flags from the
declaration, a recipe its ``tracing:`` section, and Python passes the dataclass whole
(``attempt_trace(model, tracing=TracingSettings(tracing_ignore=(...)))``).
:class:`~llmc_trace.tracing.options.TracingOptions` is what these settings resolve to against
one model (the ``tracing_ignore`` strings sorted into typed kinds).

Torch-free at import, as the declarations are (``--help`` imports no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmc_trace.core.declare import Int, Names, normalize, option
from llmc_trace.core.deprecation import renamed


@dataclass(frozen=True)
class TracingSettings:
    """How the model is traced (the fixes a trace needs are searched and added either way
    where the caller asks for the search)."""

    sequential_targets: tuple[str, ...] | None = option(
        None,
        "Target class names or 're:' path patterns (comma-separated or repeated). Default: the "
        "language model's repeated blocks.",
        Names(optional=True),
        short="-t",
    )
    targets_per_subgraph: int = option(1, "Consecutive targets grouped into one subgraph.", Int(1))
    tracing_ignore: tuple[str, ...] = option(
        (),
        "Modules (class or 're:' pattern) to keep as leaves, or functions to record as opaque "
        "calls, while tracing (comma-separated or repeated; `attempt --fix` prints the fixes "
        "it finds in this form). Default: transformers' mask builders.",
        Names(),
        renamed_from=("ignore",),
    )

    def __post_init__(self) -> None:
        normalize(self)


def tracing_settings(
    tracing: TracingSettings | None, caller: str, loose: dict[str, Any]
) -> TracingSettings:
    """The settings ``caller`` was given: ``tracing``, or built from the loose keywords it took
    before it took :class:`TracingSettings` (``sequential_targets=``, ``targets_per_subgraph=``,
    ``ignore=``), accepted for one release with a :class:`DeprecationWarning`. Both at once is
    a :class:`TypeError`, as a repeated keyword is."""
    given = {name: value for name, value in loose.items() if value is not None}
    if not given:
        return tracing or TracingSettings()
    if tracing is not None:
        raise TypeError(
            f"{caller}() got tracing= and {', '.join(f'{name}=' for name in given)}; "
            "pass them all in tracing=TracingSettings(...)"
        )
    fields = {
        ("tracing_ignore" if name == "ignore" else name): value for name, value in given.items()
    }
    spelled = ", ".join(f"{name}=..." for name in fields)
    old = ", ".join(f"{name}=" for name in given)
    renamed(f"{caller}({old})", f"tracing=TracingSettings({spelled})", stacklevel=4)
    return TracingSettings(**fields)
