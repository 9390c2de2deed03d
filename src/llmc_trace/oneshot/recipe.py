"""Recipes: the YAML that says how to compress a model, read by ``--recipe`` and written beside
every checkpoint, so that a checkpoint's ``recipe.yaml`` runs again as it ran.

One format both ways::

    calibration: {dataset: "calib.npy", samples: 128, seq_len: 512, batch_size: 1, seed: 0,
                  attn_implementation: "sdpa"}
    tracing: {sequential_targets: null, targets_per_subgraph: 1, ignore: []}
    checkpoint: {dtype: "bfloat16", max_shard_size: 5000000000}
    stages:
      - {method: "sparsegpt", sparsity: "2:4"}
      - {method: "gptq", scheme: "W4A16"}

Stage keys are the command line's (``method``, ``scheme``, ``sparsity``, ``pipeline``,
``propagate``, ``true_sequential``, ``refine_passes``, ``expert_tokens``, ``min_expert_tokens``,
``expert_group``, plus ``percdamp`` and ``blocksize``); a
scheme is a preset's name or the full mapping a written recipe holds. ``versions`` (written,
never required) records what made the checkpoint. Every mistake is bad input that names the key
and its line: an unknown or repeated key, a value of the wrong type, a missing method, an empty
stage list, an impossible combination.

The written form (:func:`render_recipe`) spells out every value, resolved: the scheme in full,
the pipeline that actually ran, the ignore list including the fixes tracing needed. Values are
JSON scalars and flow collections, which YAML reads unchanged, so the same run always gives the
same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import yaml

from llmc_trace.checkpoint.shards import DEFAULT_MAX_SHARD_SIZE
from llmc_trace.algorithms.scheme import (
    DEFAULT_IGNORE,
    DEFAULT_SCHEME,
    DEFAULT_TARGETS,
    DynamicActivationArgs,
    QuantizationArgs,
    QuantizationScheme,
    resolve_scheme,
)
from llmc_trace.core.names import AUTO, DTYPES, PRUNING_METHODS
from llmc_trace.errors import BadInputError
from llmc_trace.oneshot.stage import Stage, check_order, parse_sparsity

CALIBRATION_KEYS = ("dataset", "samples", "seq_len", "batch_size", "seed", "attn_implementation")
TRACING_KEYS = ("sequential_targets", "targets_per_subgraph", "ignore")
CHECKPOINT_KEYS = ("dtype", "max_shard_size")
#: recipe key -> Stage field, in the order a written recipe lists them
STAGE_KEYS = {
    "method": "method",
    "scheme": "scheme",
    "sparsity": "sparsity",
    "pipeline": "pipeline",
    "propagate": "propagate_error",
    "true_sequential": "true_sequential",
    "refine_passes": "refine_passes",
    "percdamp": "percdamp",
    "blocksize": "blocksize",
    "expert_tokens": "expert_tokens",
    "min_expert_tokens": "min_expert_tokens",
    "expert_group": "expert_group",
}
SCHEME_KEYS = ("name", "weights", "input_activations", "targets", "ignore")
TOP_KEYS = ("versions", "calibration", "tracing", "checkpoint", "stages")
VERSIONED = ("llmc-trace", "torch", "transformers", "compressed-tensors")
_TYPES: dict[str, tuple[type, ...]] = {
    "dataset": (str,),
    "samples": (int,),
    "seq_len": (int,),
    "batch_size": (int,),
    "seed": (int,),
    "attn_implementation": (str,),
    "targets_per_subgraph": (int,),
    "method": (str,),
    "pipeline": (str,),
    "propagate": (bool,),
    "true_sequential": (bool,),
    "refine_passes": (int,),
    "percdamp": (float, int),
    "blocksize": (int,),
    "expert_tokens": (str,),
    "min_expert_tokens": (int,),
    "expert_group": (int,),
    "max_shard_size": (int,),
}


class _Located(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers the line of each key (and its own)."""

    line: int = 0
    lines: dict[str, int]


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


def read_recipe(path: str | Path) -> dict[str, Any]:
    """``CompressRequest`` keyword arguments from the recipe at ``path`` (see module docstring).

    Raises :class:`BadInputError` naming the key and its line for anything it cannot use.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise BadInputError(
            f"cannot read the recipe {path} ({err.strerror or err}).",
            hint="Check the --recipe path.",
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
    if not isinstance(document, _Located):
        raise BadInputError(
            f"the recipe {path} is not a mapping of calibration, tracing and stages.",
            hint="Start from the recipe.yaml written beside a checkpoint, or the README's example.",
            param="recipe",
        )
    _known(document, TOP_KEYS, "the recipe")
    if "stages" not in document:
        raise _error(
            "the recipe has no `stages` list.",
            "stages",
            document.line,
            "Add `stages:` with at least one stage.",
        )
    arguments: dict[str, Any] = {}
    for section, keys in (
        ("calibration", CALIBRATION_KEYS),
        ("tracing", TRACING_KEYS),
        ("checkpoint", CHECKPOINT_KEYS),
    ):
        values = document.get(section) or _Located()
        if not isinstance(values, _Located):
            raise _error(f"`{section}` must be a mapping.", section, document.lines[section])
        _known(values, keys, f"`{section}`")
        for key, value in values.items():
            arguments[key] = _checked(key, value, values.lines[key])
    stages = document["stages"]
    line = document.lines["stages"]
    if not isinstance(stages, list):
        raise _error("`stages` must be a list of stages.", "stages", line)
    parsed = [_stage(entry, line, index) for index, entry in enumerate(stages)]
    _located(lambda: check_order(parsed), "stages", line)
    arguments["stages"] = tuple(parsed)
    return arguments


def render_recipe(
    arguments: Mapping[str, Any],
    stages: Sequence[Stage],
    *,
    ignore: Sequence[str],
    fallbacks: Sequence[Sequence[str]] = (),
) -> str:
    """A run's ``recipe.yaml``: ``arguments`` holds the calibration and tracing keys as the run
    used them, ``stages`` the stages with the pipeline each actually ran, ``ignore`` the tracing
    ignore list including the fixes that were applied. ``fallbacks[i]`` lists the layers stage
    ``i`` compressed otherwise than its method says, and why (experts too few tokens reached),
    written as comments under the stage: a record, which a rerun decides anew."""
    tracing = {
        "sequential_targets": _plain(arguments.get("sequential_targets")),
        "targets_per_subgraph": arguments.get("targets_per_subgraph", 1),
        "ignore": list(ignore),
    }
    lines = [
        "# How this checkpoint was made (written by llmc-trace); a valid --recipe.",
        f"versions: {_flow(installed_versions())}",
        "calibration:",
        *(f"  {key}: {_flow(_plain(arguments.get(key)))}" for key in CALIBRATION_KEYS),
        "tracing:",
        *(f"  {key}: {_flow(value)}" for key, value in tracing.items()),
        "checkpoint:",
        f"  dtype: {_flow(_dtype_name(arguments.get('dtype')))}",
        f"  max_shard_size: {_flow(arguments.get('max_shard_size', DEFAULT_MAX_SHARD_SIZE))}",
        "stages:",
    ]
    for index, stage in enumerate(stages):
        values = {key: getattr(stage, field) for key, field in STAGE_KEYS.items()}
        values["scheme"] = _scheme_mapping(stage.scheme)
        values["sparsity"] = _sparsity_text(stage.sparsity)
        first, *rest = values.items()
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


def _stage(entry: object, line: int, index: int) -> Stage:
    if not isinstance(entry, _Located):
        raise _error(f"stage {index + 1} is not a mapping of method, scheme, ...", "stages", line)
    _known(entry, tuple(STAGE_KEYS), f"stage {index + 1}")
    if "method" not in entry:
        raise _error(
            f"stage {index + 1} has no `method`.", "method", entry.line, "Add e.g. `method: gptq`."
        )
    options: dict[str, Any] = {}
    for key, value in entry.items():
        at = entry.lines[key]
        if key == "scheme":
            options["scheme"] = _scheme(value, at)
        elif key == "sparsity":
            options["sparsity"] = _located(lambda text=value: parse_sparsity(text), key, at)
        else:
            options[STAGE_KEYS[key]] = _checked(key, value, at)
    if "scheme" not in options and options["method"] not in PRUNING_METHODS:
        options["scheme"] = DEFAULT_SCHEME
    return _located(lambda: Stage(**options), None, entry.line, entry.lines)


def _scheme(value: object, line: int) -> QuantizationScheme | None:
    if value is None or (isinstance(value, str) and value.lower() == "none"):
        return None
    if isinstance(value, str):
        return _located(lambda: resolve_scheme(value), "scheme", line)
    if not isinstance(value, _Located):
        raise _error("`scheme` must be a preset's name or a mapping.", "scheme", line)
    _known(value, SCHEME_KEYS, "`scheme`")
    for key in ("name", "weights"):
        if key not in value:
            raise _error(f"the scheme has no `{key}`.", "scheme", value.line)

    def build() -> QuantizationScheme:
        activations = value.get("input_activations")
        try:
            return QuantizationScheme(
                str(value["name"]),
                QuantizationArgs(**value["weights"]),
                DynamicActivationArgs(**activations) if activations is not None else None,
                tuple(value.get("targets", DEFAULT_TARGETS)),
                tuple(value.get("ignore", DEFAULT_IGNORE)),
            )
        except TypeError as err:  # an unknown argument of the weights or activations
            raise BadInputError(
                f"the scheme's arguments are not valid ({err}).",
                hint="Use the keys a written recipe.yaml has.",
                param="scheme",
            ) from None

    return _located(build, "scheme", line)


def _checked(key: str, value: object, line: int) -> Any:
    if key == "dtype":
        if value is None or value == AUTO:
            return None
        if value not in DTYPES:
            raise _error(f"`dtype` must be one of {', '.join(DTYPES)}, not {value!r}.", key, line)
        return getattr(torch, str(value))
    if key == "expert_group" and value is None:
        return None
    if key in ("sequential_targets", "ignore"):
        if value is None and key == "sequential_targets":
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _error(f"`{key}` must be a list of strings.", key, line)
        return tuple(value)
    types = _TYPES[key]
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        wanted = " or ".join(t.__name__ for t in types)
        raise _error(f"`{key}` must be {wanted}, not {value!r}.", key, line)
    return float(value) if key == "percdamp" else value


def _known(mapping: _Located, keys: Sequence[str], where: str) -> None:
    for key in mapping:
        if key not in keys:
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
        param = err.param or key
        recipe_key = next((k for k, f in STAGE_KEYS.items() if f == param), param)
        at = (lines or {}).get(recipe_key, line)
        raise _error(err.message, recipe_key or "recipe", at, err.hint) from None


def _error(message: str, key: str, line: int, hint: str = "") -> BadInputError:
    """Bad input in the recipe (``param``: on the command line, ``--recipe``), naming the key
    and its line."""
    return BadInputError(f"recipe line {line}, `{key}`: {message}", hint=hint, param="recipe")


def _dtype_name(dtype: object) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _scheme_mapping(scheme: QuantizationScheme | None) -> dict[str, Any] | None:
    if scheme is None:
        return None
    activations = scheme.input_activations
    return {
        "name": scheme.name,
        "weights": dataclasses.asdict(scheme.weights),
        "input_activations": None if activations is None else dataclasses.asdict(activations),
        "targets": list(scheme.targets),
        "ignore": list(scheme.ignore),
    }


def _sparsity_text(sparsity: object) -> object:
    return f"{sparsity[0]}:{sparsity[1]}" if isinstance(sparsity, tuple) else sparsity


def _plain(value: object) -> object:
    if isinstance(value, tuple):
        return list(value)
    return str(value) if isinstance(value, Path) else value


def _flow(value: object) -> str:
    """One value as YAML flow text: JSON for scalars and lists, `{k: v}` for mappings (keys
    unquoted, as a person writes them)."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)
