"""Install traceable definitions from ``tracing_models/`` for the duration of a trace.

A definition is a subclass of a model class that overrides only the methods that do not
trace, written as a small diff against its base (as transformers' ``modular_*.py`` files
are), and registered with :func:`register`; one module per architecture in the top-level
``tracing_models`` package.
``llmc-trace attempt --fix`` tries a definition last, after opaque calls and autowrap, and
accepts it like every fix: only if the subgraphs replayed afterwards equal the *original*
model's eager forward on the same weights. See ``tracing_models/README.md``.

The mechanism lives here, in the library, and the definitions in the top-level
``tracing_models`` package, which re-exports :func:`register`; definitions are imported only
when a fix search or an ignore entry asks for them, so importing llmc-trace does no work.

A definition is installed only while a trace runs: each instance of its base class gets the
definition as its ``__class__`` and its own class back afterwards, so other models in the
process and eager calls never see it. It is named in ``ignore`` as
``tracing_models:<base class name>``, so recipes and the trace cache carry it unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator

import torch

from llmc_trace.errors import BadInputError

PREFIX = "tracing_models:"
#: The top-level package holding one definition module per architecture.
DEFINITIONS_PACKAGE = "tracing_models"

#: base class -> its traceable definition; filled by :func:`register` as modules are imported.
REGISTRY: dict[type[torch.nn.Module], type[torch.nn.Module]] = {}


def register(definition: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """Class decorator: make ``definition`` the traceable replacement of its direct base.

    Instances change class in place, so a definition may override methods only: no
    ``__init__``, no ``__slots__``, and exactly one base, the class it replaces.
    """
    if len(definition.__bases__) != 1 or not issubclass(definition, torch.nn.Module):
        raise TypeError(
            f"{definition.__name__} must subclass exactly one torch.nn.Module class: the one "
            "it replaces while tracing."
        )
    if "__init__" in vars(definition) or "__slots__" in vars(definition):
        raise TypeError(
            f"{definition.__name__} defines __init__ or __slots__; a traceable definition "
            "overrides methods only, because existing instances take it as their class."
        )
    REGISTRY[definition.__bases__[0]] = definition
    return definition


def unregister(definition: type[torch.nn.Module]) -> None:
    """Remove ``definition`` from the registry (tests register definitions of their own)."""
    base = definition.__bases__[0]
    if REGISTRY.get(base) is definition:
        del REGISTRY[base]


def load_definitions() -> dict[type[torch.nn.Module], type[torch.nn.Module]]:
    """Import every definition module of ``tracing_models``, so each registers itself."""
    package = importlib.import_module(DEFINITIONS_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{DEFINITIONS_PACKAGE}.{info.name}")
    return REGISTRY


def definition_entry(class_name: str) -> str:
    """The ``ignore`` entry that installs the definition registered for ``class_name``."""
    return f"{PREFIX}{class_name}"


def is_definition_entry(entry: str) -> bool:
    return entry.startswith(PREFIX)


def definition_class(entry: str) -> str:
    """``tracing_models:RwkvModel`` -> ``RwkvModel``."""
    return entry.removeprefix(PREFIX)


def weight_changing(entries: list[str]) -> list[str]:
    """Class names of the definitions in ``entries`` that change the model's weights while
    tracing (``changes_weights = True``, RWKV's one-off rescaling): a checkpoint written
    afterwards would hold the changed weights."""
    wanted = {definition_class(entry) for entry in entries if is_definition_entry(entry)}
    if not wanted:
        return []
    return sorted(
        base.__name__
        for base, definition in load_definitions().items()
        if base.__name__ in wanted and getattr(definition, "changes_weights", False)
    )


def definitions_for(model: torch.nn.Module) -> list[str]:
    """Names of the model's classes that have a registered definition, in module order."""
    registry = load_definitions()
    names: list[str] = []
    for module in model.modules():
        cls = type(module)
        if cls in registry and cls.__name__ not in names:
            names.append(cls.__name__)
    return names


@contextlib.contextmanager
def use_definitions(model: torch.nn.Module, entries: list[str]) -> Iterator[list[str]]:
    """Give the named classes' instances their definitions while the block runs.

    Yields the module paths that changed class; every one gets its own class back, even when
    the block raises.
    """
    wanted = {definition_class(entry) for entry in entries}
    registry = load_definitions() if wanted else REGISTRY
    changed: list[tuple[torch.nn.Module, type]] = []
    paths: list[str] = []
    found: set[str] = set()
    try:
        for path, module in model.named_modules() if wanted else ():
            cls = type(module)
            if cls.__name__ in wanted and cls in registry:
                changed.append((module, cls))
                module.__class__ = registry[cls]
                paths.append(path or "<root>")
                found.add(cls.__name__)
        if wanted - found:
            raise BadInputError(
                f"No definition in tracing_models/ is registered for a class of "
                f"{type(model).__name__} named {', '.join(sorted(wanted - found))}.",
                hint="Drop the entry from ignore, or add a definition (tracing_models/README.md).",
                param="tracing_ignore",
            )
        yield paths
    finally:
        for module, cls in reversed(changed):
            module.__class__ = cls
