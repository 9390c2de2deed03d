"""llm-compressor's ``match_modules`` and ``get_sequential_targets``, over llmc-trace's rules.

A target string means here what it means in llmc-trace's tracer and in compressed-tensors: a
class name matches the module's class or any class it derives from, ``re:`` matches the module
path from its start, anything else must equal the path. Without targets from the modifiers or
the dataset arguments, a model's own are llmc-trace's defaults
(:func:`~llmc_trace.tracing.targets.default_target_patterns`): ``_no_split_modules`` classes
outside the vision and audio towers, else the repeated blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from llmc_trace.compat.arguments import pipeline_arguments
from llmc_trace.errors import BadInputError
from llmc_trace.tracing.targets import default_target_patterns, matches

logger = logging.getLogger(__name__)


def match_modules(model: torch.nn.Module, target_names: Iterable[str]) -> set[torch.nn.Module]:
    """The submodules of ``model`` (itself included) whose path or class matches any of
    ``target_names``; nested matches are all kept, as llm-compressor keeps them."""
    names = list(target_names)
    return {
        module
        for path, module in model.named_modules()
        if any(path == name or matches(name, path, module) for name in names)
    }


def get_sequential_targets(
    modifiers: Sequence[Any], model: torch.nn.Module, args: Any
) -> list[str]:
    """The sequential targets of a run: a modifier's ``sequential_targets`` (deprecated in
    llm-compressor, still read), else the dataset arguments' (``args``: a ``DatasetArguments``,
    a mapping or ``None``), else the model's own; a single string is one target.

    Targets given twice (by two modifiers, or by a modifier and the arguments) are refused:
    which to follow would be a guess.
    """
    given = [
        (modifier, modifier.sequential_targets)
        for modifier in modifiers
        if getattr(modifier, "sequential_targets", None) is not None
    ]
    from_args = pipeline_arguments(args).sequential_targets
    if len(given) > 1 or (given and from_args is not None):
        sources = [type(modifier).__name__ for modifier, _ in given]
        if from_args is not None:
            sources.append("dataset_args.sequential_targets")
        raise BadInputError(
            f"Sequential targets are given by {' and '.join(sources)}; give them once.",
            hint="Pass sequential_targets in the dataset arguments only.",
            param="sequential_targets",
        )
    if given:
        logger.warning(
            "sequential targets passed through %s: pass them in the dataset arguments instead",
            type(given[0][0]).__name__,
        )
        targets = given[0][1]
        return [targets] if isinstance(targets, str) else list(targets)
    if from_args is not None:
        return list(from_args)
    return default_target_patterns(model, list(model.named_modules()))
