"""Recipes: the YAML that says how to compress a model, read by ``--recipe`` and written beside
every checkpoint, so that a checkpoint's ``recipe.yaml`` runs again as it ran.

One format both ways::

    calibration: {dataset: "calib.npy", samples: 128, seq_len: 512, batch_size: 1, seed: 0,
                  attn_implementation: "sdpa"}
    tracing: {sequential_targets: null, targets_per_subgraph: 1, tracing_ignore: []}
    checkpoint: {dtype: "bfloat16", max_shard_size: 5000000000}
    stages:
      - {method: "sparsegpt", sparsity: "2:4"}
      - {method: "gptq", scheme: "W4A16"}

A recipe is a request's options, serialised: each section is one of
:data:`~llmc_trace.spec.settings.SECTIONS` and its keys are that section's declared options
(:mod:`~llmc_trace.core.declare`), the same names as ``compress``'s flags; a scheme is a
preset's name or the full mapping a written recipe holds. ``versions`` (written, never
required) records what made the checkpoint. A key under an earlier name (``ignore`` under
``tracing``) is read with a warning naming the new one. Every mistake is bad input that names
the key and its line: an unknown or repeated key, a value of the wrong kind, an empty stage
list, an impossible combination.

The written form (:func:`render_recipe`) spells out every value, resolved: the scheme in full,
the pipeline that actually ran, the tracing ignore list including the fixes tracing needed.
Values are JSON scalars and flow collections, which YAML reads unchanged, so the same run always
gives the same bytes.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from llmc_trace.errors import BadInputError
from llmc_trace.core.declare import Declared, build, declared, written
from llmc_trace.spec.settings import (
    SECTIONS,
    CalibrationSettings,
    CheckpointSettings,
    TracingSettings,
)
from llmc_trace.spec.stage import Stage, check_order

TOP_KEYS = ("versions", *SECTIONS)
#: the first line of every recipe a run writes: how ``--overwrite`` knows a checkpoint is ours
RECIPE_HEADER = "# How this checkpoint was made (written by llmc-trace)"
VERSIONED = ("llmc-trace", "torch", "transformers", "compressed-tensors")


@dataclass(frozen=True)
class Recipe:
    """A run's options by section, as a recipe file holds them."""

    calibration: CalibrationSettings
    tracing: TracingSettings
    checkpoint: CheckpointSettings
    stages: tuple[Stage, ...]


class _Located(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers the line of each key (and its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.line = 0
        self.lines: dict[str, int] = {}


class _Loader(yaml.SafeLoader):
    """Safe YAML with line numbers, where ``2:4`` is the text it looks like: YAML 1.1 reads an
    unquoted ``2:4`` as the base-60 integer 124."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


for _digit in "0123456789":
    _Loader.yaml_implicit_resolvers.setdefault(_digit, []).insert(
        0, ("tag:yaml.org,2002:str", re.compile(r"^[0-9]+:[0-9]+$"))
    )


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Located:
    loader.flatten_mapping(node)
    mapping = _Located()
    mapping.line, mapping.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping:
            raise _error(
                f"the key {key!r} is given twice (lines {mapping.lines[key]} and {line}).",
                key,
                line,
                "Keep one.",
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_recipe(path: str | Path) -> Recipe:
    """The recipe at ``path`` (see the module docstring); options it leaves out keep their
    declared defaults.

    Raises :class:`BadInputError` naming the key and its line for anything it cannot use.
    """
    document = _load(Path(path))
    _known(document, TOP_KEYS, "the recipe", {})
    if "stages" not in document:
        raise _error(
            "the recipe has no `stages` list.",
            "stages",
            document.line,
            "Add `stages:` with at least one stage.",
        )
    sections: dict[str, Any] = {}
    for name, section in SECTIONS.items():
        if name == "stages":
            continue
        values = document.get(name) or _Located()
        if not isinstance(values, _Located):
            raise _error(f"`{name}` must be a mapping.", name, document.lines[name])
        sections[name] = _section(values, section, name)
    stages = document["stages"]
    line = document.lines["stages"]
    if not isinstance(stages, list):
        raise _error("`stages` must be a list of stages.", "stages", line)
    parsed = tuple(_stage(entry, line, index) for index, entry in enumerate(stages))
    _located(lambda: check_order(parsed), "stages", line)
    return Recipe(stages=parsed, **sections)


def render_recipe(recipe: Recipe, *, fallbacks: Sequence[Sequence[str]] = ()) -> str:
    """A run's ``recipe.yaml``: every option of ``recipe`` written out, resolved (the run
    passes its stages with the pipeline each actually ran, its tracing ignore list with the
    fixes that were applied, the checkpoint's dtype). ``fallbacks[i]`` lists the layers stage
    ``i`` compressed otherwise than its method says, and why (experts too few tokens reached),
    written as comments under the stage: a record, which a rerun decides anew."""
    lines = [
        f"{RECIPE_HEADER}; a valid --recipe.",
        f"versions: {_flow(installed_versions())}",
    ]
    for name in SECTIONS:
        if name != "stages":
            lines.append(f"{name}:")
            lines += [
                f"  {key}: {_flow(value)}" for key, value in written(getattr(recipe, name)).items()
            ]
    lines.append("stages:")
    for index, stage in enumerate(recipe.stages):
        first, *rest = written(stage).items()
        lines.append(f"  - {first[0]}: {_flow(first[1])}")
        lines += [f"    {key}: {_flow(value)}" for key, value in rest]
        notes = fallbacks[index] if index < len(fallbacks) else ()
        if notes:
            lines.append(f"    # {len(notes)} layers compressed otherwise:")
            lines += [f"    #   {note}" for note in notes]
    return "\n".join(lines) + "\n"


def installed_versions() -> dict[str, str | None]:
    """The versions that decide a checkpoint's bytes (a rerun under others may differ)."""
    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _load(path: Path) -> _Located:
    """The recipe's YAML document, with lines; unreadable or malformed files are bad input,
    binary ones among them (a recipe is UTF-8 text, and YAML refuses control characters)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInputError(
            f"cannot read the recipe {path} ({err.strerror or err}).",
            hint="Check the --recipe path.",
            param="recipe",
        ) from None
    except UnicodeDecodeError as err:
        raise BadInputError(
            f"the recipe {path} is not UTF-8 text (byte {err.start} is "
            f"{err.object[err.start]:#04x}).",
            hint="Check that --recipe names a YAML file, such as a checkpoint's recipe.yaml, "
            "saved as UTF-8.",
            param="recipe",
        ) from None
    try:
        document = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        raise BadInputError(
            f"the recipe {path} is not valid YAML at line {mark.line + 1 if mark else '?'}: "
            f"{err.problem}.",
            hint="Fix the YAML syntax (indentation, colons, brackets).",
            param="recipe",
        ) from None
    except yaml.reader.ReaderError as err:  # a character YAML refuses: a position, no mark
        line = text.count("\n", 0, err.position) + 1
        raise BadInputError(
            f"the recipe {path} is not valid YAML at line {line}: it holds "
            f"U+{err.character:04X}, a character YAML does not allow.",
            hint="Remove the character, or check that --recipe names a YAML file.",
            param="recipe",
        ) from None
    if not isinstance(document, _Located):
        raise BadInputError(
            f"the recipe {path} is not a mapping of calibration, tracing and stages.",
            hint="Start from the recipe.yaml written beside a checkpoint, or the README's example.",
            param="recipe",
        )
    return document


def _section(values: _Located, section: type, name: str) -> Any:
    """The ``section`` dataclass from a recipe's mapping of its options, located."""
    return _located(
        lambda: section(**_values(values, section, f"`{name}`")), None, values.line, values.lines
    )


def _values(mapping: _Located, section: type, where: str) -> dict[str, Any]:
    """The options ``mapping`` gives for ``section``, each read through its kind."""
    entries = {entry.name: entry for entry in declared(section)}
    renamed = {old: entry.name for entry in entries.values() for old in entry.option.renamed_from}
    _known(mapping, tuple(entries), where, renamed)
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        name = renamed.get(key, key) if key not in entries else key
        if name != key:
            warnings.warn(
                f"recipe line {mapping.lines[key]}: {where} key `{key}` is now `{name}`; "
                f"write `{name}`.",
                FutureWarning,
                stacklevel=2,
            )
        values[name] = _read(entries[name], value, mapping.lines[key])
    return values


def _read(entry: Declared, value: object, line: int) -> Any:
    try:
        return entry.kind.read(value)
    except BadInputError as err:  # a ValueError too: caught first, so its hint stays its own
        raise _error(err.message, entry.name, line, err.hint) from None
    except ValueError as err:
        raise _error(f"{err}.", entry.name, line) from None


def _stage(entry: object, line: int, index: int) -> Stage:
    if not isinstance(entry, _Located):
        raise _error(f"stage {index + 1} is not a mapping of method, scheme, ...", "stages", line)
    if "method" not in entry:
        raise _error(
            f"stage {index + 1} has no `method`.", "method", entry.line, "Add e.g. `method: gptq`."
        )
    values = _values(entry, Stage, f"stage {index + 1}")
    return _located(lambda: build(Stage, values), None, entry.line, entry.lines)


def _known(mapping: _Located, keys: Sequence[str], where: str, renamed: Mapping[str, str]) -> None:
    for key in mapping:
        if key not in keys and key not in renamed:
            raise _error(
                f"{where} has an unknown key {key!r}.",
                str(key),
                mapping.lines[key],
                f"Use {', '.join(keys)}.",
            )


def _located(build: Any, key: str | None, line: int, lines: Mapping[str, int] | None = None) -> Any:
    """``build()``, with a bad-input error it raises pointed at the recipe line of its key."""
    try:
        return build()
    except BadInputError as err:
        if err.message.startswith("recipe line"):
            raise
        recipe_key = err.param or key
        at = (lines or {}).get(recipe_key or "", line)
        raise _error(err.message, recipe_key or "recipe", at, err.hint) from None


def _error(message: str, key: str, line: int, hint: str = "") -> BadInputError:
    """Bad input in the recipe (``param``: on the command line, ``--recipe``), naming the key
    and its line."""
    return BadInputError(f"recipe line {line}, `{key}`: {message}", hint=hint, param="recipe")


def _flow(value: object) -> str:
    """One value as YAML flow text: JSON for scalars and lists, `{k: v}` for mappings (keys
    unquoted, as a person writes them)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)
