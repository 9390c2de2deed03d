"""Choose the sequential targets and the leaves of a trace.

Sequential targets default to the *language model's* repeated blocks, found through
``_no_split_modules`` (the classes transformers never splits across devices), leaving out every
instance that sits in a vision or audio tower: compressing a tower is opt-in. Patterns accept
class names (``LlamaDecoderLayer``) and ``re:`` regular expressions on module paths
(``re:model\\.layers\\.\\d+$``).

Leaves are the targets, the ignored modules, and every module that is not an ancestor of a
target: nothing inside them is traced, so untraceable code there does no harm.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from llmc_trace.core.names import module_matches
from llmc_trace.errors import BadInputError

logger = logging.getLogger(__name__)

#: Path components that mark a vision or audio tower (or its projector).
TOWER_PATTERN = re.compile(
    r"(^|\.)(visual|vision\w*|image\w*|img\w*|audio\w*|speech_\w*|patch_embed\w*|"
    r"multi_modal_projector|mm_projector|vqmodel|connector|perceiver\w*|qformer\w*)(\.|$)"
)

LEAF_TARGET = "sequential target"
LEAF_IGNORED = "ignored"
LEAF_NO_TARGET = "holds no sequential target"


@dataclass(frozen=True)
class LeafPlan:
    """Which module paths are targets, ignored, or traced through (ancestors of targets)."""

    targets: tuple[str, ...]
    ignored: tuple[str, ...]
    ancestors: frozenset[str]
    #: target class names the user listed that no module of the model has (reported, not
    #: fatal: lists such as ``model._no_split_modules`` name classes a model never builds)
    unmatched: tuple[str, ...] = ()
    _target_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _ignored_set: frozenset[str] = field(init=False, repr=False, compare=False)

    def leaf_reason(self, path: str) -> str | None:
        """Why ``path`` is a leaf, or ``None`` when the tracer walks into it."""
        if path in self._target_set:
            return LEAF_TARGET
        if path in self._ignored_set:
            return LEAF_IGNORED
        if path in self.ancestors:
            return None
        return LEAF_NO_TARGET

    def __post_init__(self) -> None:
        # membership is asked once per module call while tracing: keep sets, not tuples
        object.__setattr__(self, "_target_set", frozenset(self.targets))
        object.__setattr__(self, "_ignored_set", frozenset(self.ignored))


def matches(pattern: str, path: str, module: torch.nn.Module) -> bool:
    """Whether a target or ignore pattern names this module
    (:func:`~llmc_trace.core.names.module_matches`, the rule every module pattern follows)."""
    return module_matches(pattern, path, module)


#: Every ``(path, module)`` of a model, walked once: a model with thousands of experts makes
#: each walk cost tens of milliseconds, and planning the leaves asks several questions of it.
Modules = list[tuple[str, torch.nn.Module]]


def audio_tower_paths(model: torch.nn.Module, modules: Modules) -> set[str]:
    """For speech models (main input is audio features), the encoder is the audio tower."""
    if getattr(model, "main_input_name", "") not in ("input_features", "input_values"):
        return set()
    get_encoder = getattr(model, "get_encoder", None)
    encoder = get_encoder() if callable(get_encoder) else None
    if encoder is None:
        return set()
    return {path for path, module in modules if module is encoder}


def is_in_tower(path: str, towers: Iterable[str] = ()) -> bool:
    return TOWER_PATTERN.search(path) is not None or any(
        path == tower or path.startswith(tower + ".") for tower in towers
    )


def no_split_classes(modules: Modules) -> list[str]:
    names: list[str] = []
    for _, module in modules:
        for name in getattr(module, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    return names


def default_target_patterns(model: torch.nn.Module, modules: Modules) -> list[str]:
    """Classes from ``_no_split_modules`` that have instances outside every tower; failing
    that, the repeated block classes (:func:`repeated_block_classes`)."""
    towers = audio_tower_paths(model, modules)
    present = {
        type(module).__name__ for path, module in modules if path and not is_in_tower(path, towers)
    }
    classes = [name for name in no_split_classes(modules) if name in present]
    if classes:
        return classes
    return repeated_block_classes(modules, towers)


def repeated_block_classes(modules: Modules, towers: set[str]) -> list[str]:
    """Classes of the blocks a model stacks, for models that name no ``_no_split_modules``.

    A stack is a ``ModuleList`` of two or more modules of one class, outside every tower,
    whose class is the model's own (not a bare ``torch.nn`` layer such as a prenet's Linear
    list) and holds a weight matrix to compress (a Linear, or GPT's transposed Conv1D). An
    encoder-decoder stacks two classes (SpeechT5's encoder and decoder layers): both are
    targets.
    """
    found: list[str] = []
    for path, module in modules:
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        if is_in_tower(path, towers):
            continue
        classes = {type(child) for child in module}
        if len(classes) != 1:
            continue
        cls = classes.pop()
        if cls.__module__.startswith("torch.nn") or cls.__name__ in found:
            continue
        if any(p.dim() == 2 for p in module[0].parameters()):
            found.append(cls.__name__)
    return found


def resolve_targets(
    model: torch.nn.Module, modules: Modules, patterns: list[str] | None, *, explicit: bool
) -> list[str]:
    """Module paths of the sequential targets, outermost matches only, in module order.

    The walk is depth-first, so a chosen target's descendants follow it at once: only the
    latest choice can contain the current path.
    """
    towers = set() if explicit else audio_tower_paths(model, modules)
    chosen: list[str] = []
    for path, module in modules:
        if not path or (chosen and path.startswith(chosen[-1] + ".")):
            continue
        if not explicit and is_in_tower(path, towers):
            continue
        if any(matches(pattern, path, module) for pattern in patterns or []):
            chosen.append(path)
    return chosen


def plan_leaves(
    model: torch.nn.Module,
    sequential_targets: list[str] | None,
    ignore_modules: list[str],
) -> LeafPlan:
    """Resolve targets and ignored modules into a :class:`LeafPlan`, checking the user's input."""
    modules = list(model.named_modules())
    known_classes = {cls.__name__ for _, m in modules for cls in type(m).__mro__}
    explicit = sequential_targets is not None
    patterns = sequential_targets if explicit else default_target_patterns(model, modules)
    unmatched = [p for p in patterns if not p.startswith("re:") and p not in known_classes]
    if unmatched and len(unmatched) == len(patterns):
        pattern = unmatched[0]
        close = sorted(c for c in known_classes if pattern.lower()[:5] in c.lower())[:5]
        raise BadInputError(
            f"Sequential target class {pattern!r} does not exist in {type(model).__name__}.",
            hint=f"Use a class name the model has (e.g. {', '.join(close) or no_split_classes(modules)}) "
            "or a 're:' pattern on module paths.",
            param="sequential_targets",
        )
    if unmatched:
        logger.warning(
            "sequential targets %s name no module of %s; tracing with the others",
            ", ".join(unmatched),
            type(model).__name__,
        )
    targets = resolve_targets(model, modules, patterns, explicit=explicit)
    if not targets and not explicit:
        # nobody named targets: the model has no repeated block to hold them (a config with
        # no layers, num_hidden_layers: 0 or -1, builds an empty ModuleList)
        raise BadInputError(
            f"{type(model).__name__} as its config builds it has no repeated blocks (decoder "
            "layers) to calibrate one by one.",
            hint="Check the config's layer count (num_hidden_layers or the like), or name "
            "--sequential-targets.",
            param="model",
        )
    if not targets:
        raise BadInputError(
            f"The sequential targets {patterns} match no module of {type(model).__name__}.",
            hint="Pick the model's repeated block class (see `llmc-trace render --view modules`) "
            "or a 're:' pattern that matches module paths such as 'model.layers.0'.",
            param="sequential_targets",
        )
    ancestors = {""}
    for target in targets:
        parts = target.split(".")
        ancestors.update(".".join(parts[:i]) for i in range(1, len(parts)))
    ignored = []
    for path, module in modules:
        if path and any(matches(p, path, module) for p in ignore_modules):
            if path in ancestors:
                raise BadInputError(
                    f"Ignoring {path!r} would hide the sequential targets inside it.",
                    hint="Ignore a smaller module, or choose targets outside it.",
                    param="tracing_ignore",
                )
            if not any(path.startswith(t + ".") or path == t for t in targets):
                ignored.append(path)
    return LeafPlan(tuple(targets), tuple(ignored), frozenset(ancestors), tuple(unmatched))
