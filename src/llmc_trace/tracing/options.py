"""``TracingOptions``: what to trace and how, typed; the ``tracing_ignore`` strings are parsed
here only.

:class:`~llmc_trace.tracing.settings.TracingSettings` is what a user asks for; these options
are what it resolves to against one model. On the command line, in recipes and in
``TracingSettings``, one ``tracing_ignore`` list names everything tracing should leave
alone, as llm-compressor's does: module classes (``Qwen2VisionTransformerPretrainedModel``),
``re:`` patterns on module paths, functions and methods to record as one call
(``Qwen2VLModel.get_rope_index``), statements to move into a recorded call
(``autowrap:Gemma4Model.forward@812``) and classes to trace through their registered definition
(``tracing_models:RwkvModel``). :meth:`TracingOptions.parse` sorts those strings into typed
fields against the model, and a name that matches nothing in the model is bad input that
names the closest matches (a mistyped class name must not silently become a function name).
:meth:`TracingOptions.tracing_ignore` gives the strings back, for reports and recipes.

A program's list is another matter: llm-compressor's contract is one ``tracing_ignore`` for
every model (its default names functions of a dozen architectures), so :func:`known_ignore`
keeps what names something of this model and drops the rest with one warning listing them,
flagging a likely typo with its closest name. The command line and recipes, typed by a
person, are refused instead (:meth:`TracingOptions.parse`).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmc_trace.core.deprecation import renamed
from llmc_trace.errors import BadInputError
from llmc_trace.tracing.autowrap import is_autowrap_entry, parse_entry
from llmc_trace.tracing.definitions import is_definition_entry
from llmc_trace.tracing.opaque import default_opaque_functions, module_files

logger = logging.getLogger(__name__)

#: how close to a name of the model an unknown entry must be to be called a likely typo
TYPO_CUTOFF = 0.85


@dataclass(frozen=True)
class TracingOptions:
    """How one trace is made.

    ``sequential_targets``: class names or ``re:`` path patterns, ``None`` for the model's
    repeated blocks. ``ignored_modules``: class names or ``re:`` path patterns of modules that
    become leaves. ``opaque_calls``: functions (``name``) and methods (``Class.name``) recorded
    as one graph call. ``autowraps``: ``autowrap:<function>@<line>`` statements moved into a
    recorded call. ``definitions``: ``tracing_models:<Class>`` classes traced through their
    registered definition. ``targets_per_subgraph``: how many targets one subgraph holds.
    ``record_decisions``: record the branches model code takes
    (:mod:`~llmc_trace.tracing.decisions`); off unless asked, since following model code
    slows Python 3.11's interpreter down for the whole trace.
    """

    sequential_targets: tuple[str, ...] | None = None
    ignored_modules: tuple[str, ...] = ()
    opaque_calls: tuple[str, ...] = ()
    autowraps: tuple[str, ...] = ()
    definitions: tuple[str, ...] = ()
    targets_per_subgraph: int = 1
    record_decisions: bool = False

    def __post_init__(self) -> None:
        if self.targets_per_subgraph < 1:
            raise BadInputError(
                f"targets_per_subgraph must be at least 1, got {self.targets_per_subgraph}.",
                hint="Use 1 for one decoder layer per subgraph.",
                param="targets_per_subgraph",
            )
        for pattern in self.sequential_targets or ():
            _check_pattern(pattern, "sequential_targets")
        for pattern in self.ignored_modules:
            _check_pattern(pattern, "tracing_ignore")

    @classmethod
    def parse(
        cls,
        model: torch.nn.Module,
        tracing_ignore: Sequence[str] = (),
        sequential_targets: Sequence[str] | None = None,
        targets_per_subgraph: int = 1,
    ) -> TracingOptions:
        """Sort the ``tracing_ignore`` strings into typed fields, checking each against
        ``model``: an entry naming nothing of it is bad input (see :func:`known_ignore` for a
        program's)."""
        classes = _class_names(model)
        sorted_into: dict[str, list[str]] = {kind: [] for kind in _KINDS}
        for entry in dict.fromkeys(tracing_ignore):  # keep order, drop repeats
            kind = _kind(model, entry, classes)
            if kind is None:
                raise BadInputError(
                    f"{entry!r} in tracing_ignore matches no module class, function or method of "
                    f"{type(model).__name__}.",
                    hint=_closest(entry, model, classes),
                    param="tracing_ignore",
                )
            if kind == "autowrap":
                parse_entry(entry)  # raises for a malformed entry
            sorted_into[kind].append(entry)
        modules, calls, autowraps, definitions = sorted_into.values()
        return cls(
            sequential_targets=None if sequential_targets is None else tuple(sequential_targets),
            ignored_modules=tuple(modules),
            opaque_calls=tuple(calls),
            autowraps=tuple(autowraps),
            definitions=tuple(definitions),
            targets_per_subgraph=targets_per_subgraph,
        )

    def tracing_ignore(self) -> list[str]:
        """The ``tracing_ignore`` strings these options were parsed from (recipe and CLI
        form)."""
        return [*self.ignored_modules, *self.opaque_calls, *self.autowraps, *self.definitions]

    def with_tracing_ignore(self, model: torch.nn.Module, entries: Sequence[str]) -> TracingOptions:
        """These options with ``entries`` added to ``tracing_ignore`` (a fix being tried)."""
        parsed = TracingOptions.parse(
            model,
            [*self.tracing_ignore(), *entries],
            self.sequential_targets,
            self.targets_per_subgraph,
        )
        return dataclasses.replace(parsed, record_decisions=self.record_decisions)

    def ignore_list(self) -> list[str]:
        """Deprecated: :meth:`tracing_ignore` (removed in the next release)."""
        renamed("TracingOptions.ignore_list()", "TracingOptions.tracing_ignore()")
        return self.tracing_ignore()

    def with_ignore(self, model: torch.nn.Module, entries: Sequence[str]) -> TracingOptions:
        """Deprecated: :meth:`with_tracing_ignore` (removed in the next release)."""
        renamed("TracingOptions.with_ignore()", "TracingOptions.with_tracing_ignore()")
        return self.with_tracing_ignore(model, entries)


#: llm-compressor 0.14's default ``tracing_ignore``: functions of many models, most of which a
#: given model does not have. Callers written for it pass the whole list
#: (:mod:`llmc_trace.compat`); :func:`known_ignore` drops the ones a model lacks without a word.
DEFAULT_TRACING_IGNORE = (
    "_update_causal_mask",
    "create_causal_mask",
    "_update_mamba_mask",
    "make_causal_mask",
    "get_causal_mask",
    "mask_interface",
    "mask_function",
    "_prepare_4d_causal_attention_mask",
    "_prepare_fsmt_decoder_inputs",
    "_prepare_4d_causal_attention_mask_with_cache_position",
    "_update_linear_attn_mask",
    "project_per_layer_inputs",
    "_apply_attn_res",
)


def known_ignore(model: torch.nn.Module, ignore: str | Sequence[str]) -> list[str]:
    """The entries of ``ignore`` that name something of ``model``, in order; the others are
    dropped with one warning listing them, each likely typo with the model's closest name (see
    the module docstring). A string is one entry, never its characters. Entries in llmc-trace's
    own forms (``re:``, ``autowrap:``, ``tracing_models:``) are kept, so that a malformed one
    is reported when parsed, not dropped. Entries of :data:`DEFAULT_TRACING_IGNORE` are
    dropped silently: a caller passing llm-compressor's defaults did not write them."""
    entries = list(dict.fromkeys([ignore] if isinstance(ignore, str) else ignore))
    classes = _class_names(model)
    unknown = [entry for entry in entries if _kind(model, entry, classes) is None]
    named = [entry for entry in unknown if entry not in DEFAULT_TRACING_IGNORE]
    if named:
        listed = []
        for entry in named:
            close = _close_names(entry, model, classes, TYPO_CUTOFF)
            listed.append(f"{entry!r}" + (f" (a likely typo of {close[0]!r})" if close else ""))
        logger.warning(
            "dropped from ignore, naming nothing in %s: %s",
            type(model).__name__,
            ", ".join(listed),
        )
    return [entry for entry in entries if entry not in unknown]


#: what an ``ignore`` entry can be, in the order :class:`TracingOptions` holds them
_KINDS = ("module", "call", "autowrap", "definition")


def _kind(model: torch.nn.Module, entry: str, classes: set[str]) -> str | None:
    """Which of :data:`_KINDS` ``entry`` is, for ``model``; ``None``: it names nothing."""
    if is_autowrap_entry(entry):
        return "autowrap"
    if is_definition_entry(entry):
        return "definition"
    if entry.startswith("re:") or entry in classes:
        return "module"
    if _names_a_call(model, entry):
        return "call"
    return None


def _class_names(model: torch.nn.Module) -> set[str]:
    """Every class name of ``model``'s modules and their bases."""
    return {cls.__name__ for module in model.modules() for cls in type(module).__mro__}


def _check_pattern(pattern: str, param: str) -> None:
    if not pattern.startswith("re:"):
        return
    try:
        re.compile(pattern[3:])
    except re.error as err:
        raise BadInputError(
            f"{pattern!r} is not a valid regular expression ({err}).",
            hint="Write a Python regular expression after 're:', e.g. 're:model\\.layers\\.\\d+$'.",
            param=param,
        ) from None


def _names_a_call(model: torch.nn.Module, name: str) -> bool:
    """Does ``name`` name a function of the model's code or a method of one of its modules?"""
    if name in default_opaque_functions():
        return True
    owner, _, attr = name.rpartition(".")
    for module in model.modules():
        for cls in type(module).__mro__:
            if owner and cls.__name__ != owner:
                continue
            if callable(getattr(cls, attr, None)):
                return True
    if not owner:
        return any(inspect.isfunction(vars(m).get(attr)) for m in module_files(model.modules()))
    return False


def _close_names(
    name: str, model: torch.nn.Module, classes: set[str], cutoff: float = 0.6
) -> list[str]:
    """The model's class and ``Class.method`` names closest to ``name`` (at most three)."""
    candidates = set(classes)
    for module in model.modules():
        for attr, value in vars(type(module)).items():
            if inspect.isfunction(value) and not attr.startswith("__"):
                candidates.add(f"{type(module).__name__}.{attr}")
    return difflib.get_close_matches(name, sorted(candidates), n=3, cutoff=cutoff)


def _closest(name: str, model: torch.nn.Module, classes: set[str]) -> str:
    """A hint naming the model's class or method names closest to ``name``."""
    close = _close_names(name, model, classes)
    suggestion = f"Did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"{suggestion}Name a module class, a 're:' pattern on module paths, a function, or a "
        "method as 'Class.method' (see `llmc-trace render --view modules`)."
    )
