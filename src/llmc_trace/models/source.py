"""Resolve a model name to its config: a built-in, a local folder, or a Hugging Face hub id.

Weights are never needed: tracing runs on ``meta`` and verification on a tiny twin. Built-ins
are the published ``config.json`` (and processor config) of real checkpoints, shipped in
``models/builtin/<org>/<name>/`` with their origin recorded in ``SOURCES.json``, so the tool
answers offline exactly as it would online.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError
import transformers
from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig

from llmc_trace.core.files import read_json
from llmc_trace.core.hub import hub_unreachable
from llmc_trace.errors import BadInputError

BUILTIN_PACKAGE = "llmc_trace.models"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's config came from and what else lies beside it."""

    name: str
    kind: str  # "builtin", "folder" or "hub"
    folder: Path | None
    config_dict: dict[str, Any]

    def weights_folder(self, doing: str, *, param: str = "model", hint: str = "") -> Path:
        """The folder holding this model's weights; a built-in or a hub id is a config alone,
        refused before any work saying so (a built-in's own folder holds no weights, and
        naming it sent people looking inside the package). ``doing``: what the weights are
        for ("compress"); ``hint``: what to do instead, first."""
        if self.kind == "folder" and self.folder is not None:
            return self.folder
        what = "a built-in config" if self.kind == "builtin" else "a hub id (its config alone)"
        twin = (
            '`python -c "from llmc_trace.twins import save_twin; '
            f"save_twin('{self.name}', 'twin')\"` saves a tiny random-weight copy to try."
        )
        point = "point --model at a checkpoint folder (config.json beside *.safetensors);"
        raise BadInputError(
            f"{self.name} is {what}: it has no weights to {doing}.",
            hint=f"{hint} {point} {twin}" if hint else f"{point.capitalize()} {twin}",
            param=param,
        )

    def config(self, read_as: str | None = None) -> PretrainedConfig:
        """A fresh config object (callers may change it); with ``read_as``, the published values
        built into that model type's config class instead of the one the JSON names (a built-in
        whose ``SOURCES.json`` entry says the type reads it, see :func:`builtin_names_of_type`)."""
        data = dict(self.config_dict)
        own = data.pop("model_type", None)
        model_type = read_as or own
        if model_type is None:
            raise BadInputError(
                f"The config of {self.name} has no 'model_type'.",
                hint="Point --model at a folder whose config.json was saved by transformers.",
                param="model",
            )
        if model_type not in CONFIG_MAPPING:
            hint = "Upgrade transformers, or pick a built-in (`llmc-trace coverage` lists them)."
            if "auto_map" in data:
                hint = (
                    "Its config.json asks for the checkpoint's own Python code (auto_map), which "
                    "llmc-trace does not run: use a version of the model that transformers ships "
                    "(often published under the same name with an -hf suffix)."
                )
            raise BadInputError(
                f"transformers {transformers.__version__} does not know the "
                f"model type {model_type!r} of {self.name}.",
                hint=hint,
                param="model",
            )
        try:
            return AutoConfig.for_model(model_type, **data)
        except (StrictDataclassError, KeyError, TypeError, ValueError, ArithmeticError) as err:
            # transformers' own checks of the values (a width its heads do not divide, a field
            # of the wrong type): the model could not be built from this config either
            raise BadInputError(
                f"The config of {self.name} is not a valid {model_type!r} config: "
                f"{_validation_message(err)}",
                hint="Correct config.json (or restore it from the checkpoint it came from).",
                param="model",
            ) from err
        except AttributeError as err:
            # transformers' own validator crashing on a value's shape, not rejecting it: a
            # config published for a newer release (a field that became a dict, say)
            version = transformers.__version__
            raise BadInputError(
                f"transformers {version} cannot read the config of {self.name} as a "
                f"{model_type!r} config: its check of the values failed "
                f"(AttributeError: {_short(err)}).",
                hint="The config may be written for a newer transformers release: upgrade "
                "transformers (pip install -U transformers), or correct config.json.",
                param="model",
            ) from err

    def preprocessor_config(self) -> dict[str, Any] | None:
        if self.folder is None:
            return None
        path = self.folder / "preprocessor_config.json"
        return json.loads(path.read_text()) if path.exists() else None


def builtin_root() -> Path:
    return Path(str(resources.files(BUILTIN_PACKAGE) / "builtin"))


def builtin_names() -> list[str]:
    """Hub ids of every built-in config, sorted."""
    root = builtin_root()
    if not root.exists():
        return []
    return sorted(
        str(path.parent.relative_to(root)).replace("\\", "/")
        for path in root.glob("*/*/config.json")
    )


def builtin_names_of_type(model_type: str) -> list[str]:
    """Hub ids of the built-ins whose config is of ``model_type``, or holds a sub-config of it
    (a published Qwen2.5-Omni config's thinker), sorted, then those read as ``model_type``:
    published configs to sweep a type from where its config class's defaults cannot run."""
    return _builtin_types().get(model_type, []) + builtin_read_as().get(model_type, [])


def builtin_read_as() -> dict[str, list[str]]:
    """Model type -> the built-ins its config class reads although their JSON names a sibling
    type, from the ``read_as`` of each ``SOURCES.json`` entry (which says why: transformers'
    config class for the type names that checkpoint as its own, or runs the type with the
    implementation of the checkpoint's model)."""
    found: dict[str, list[str]] = {}
    for name, entry in sorted(_sources().items()):
        for model_type in entry.get("read_as", {}):
            found.setdefault(model_type, []).append(name)
    return found


@functools.cache
def _sources() -> dict[str, Any]:
    path = builtin_root() / "SOURCES.json"
    return read_json(path) if path.exists() else {}


@functools.cache
def _builtin_types() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name in builtin_names():
        for model_type in _model_types(read_json(builtin_root() / name / "config.json")):
            if name not in found.setdefault(model_type, []):
                found[model_type].append(name)
    return found


def _model_types(config: dict[str, Any]) -> list[str]:
    """The ``model_type`` of a config's JSON and of each sub-config in it, the top one first."""
    own = config.get("model_type")
    nested = [t for v in config.values() if isinstance(v, dict) for t in _model_types(v)]
    return ([own] if isinstance(own, str) and own else []) + nested


def resolve_model(name: str) -> ModelSource:
    """Find ``name`` among the built-ins, as a local folder, or on the Hub (config only)."""
    if not name.strip():
        raise BadInputError(
            "the model is empty.",
            hint="Give a built-in name, a hub id or a local folder holding config.json.",
            param="model",
        )
    folder = builtin_root() / name
    is_hub_style = not Path(name).is_absolute() and ".." not in Path(name).parts
    if is_hub_style and (folder / "config.json").exists():
        return ModelSource(name, "builtin", folder, read_json(folder / "config.json"))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise BadInputError(
                f"The folder {name} has no config.json.",
                hint="Point --model at a checkpoint folder (config.json beside the weights), "
                "or use a hub id or a built-in name.",
                param="model",
            )
        return ModelSource(name, "folder", path, read_json(path / "config.json"))
    if not is_hub_style or name.startswith((".", "~")):
        raise BadInputError(
            f"No folder at {name}.",
            hint="Point --model at an existing checkpoint folder (config.json beside the "
            "weights), or use a hub id or a built-in name.",
            param="model",
        )
    if name.count("/") != 1:
        raise BadInputError(
            f"{name!r} is not a built-in model, a folder, or a hub id of the form org/name.",
            hint=f"Built-ins include {', '.join(builtin_names()[:4])}; `llmc-trace coverage` "
            "lists them all.",
            param="model",
        )
    return _from_hub(name)


def _from_hub(name: str) -> ModelSource:
    unreachable = hub_unreachable()
    try:
        # Unreachable, a copy in the local cache is all there is: look there without the
        # hub client's retries.
        config = AutoConfig.from_pretrained(name, local_files_only=unreachable is not None)
    except OSError as err:
        close = difflib.get_close_matches(name, builtin_names(), n=3, cutoff=0.6)
        suggestion = (
            f"closest: {', '.join(close)}" if close else f"e.g. {', '.join(builtin_names()[:3])}"
        )
        reason = f"{unreachable}, and no copy is cached" if unreachable else _short(err)
        raise BadInputError(
            f"Could not fetch the config of {name!r} from the Hugging Face Hub ({reason}).",
            hint=f"Without network access, use a built-in ({suggestion}; "
            "`llmc-trace coverage` lists all) or a local folder holding config.json.",
            param="model",
        ) from err
    return ModelSource(name, "hub", None, config.to_dict())


def _validation_message(err: BaseException) -> str:
    """The innermost reason of a config check: transformers wraps each in a line naming its
    validator, with the reason on the last line."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:160]


def quantized_method(source: ModelSource) -> str | None:
    """The method that quantized the weights ``source`` stores (its ``config.json``'s
    ``quantization_config``), or ``None`` for weights as trained: a compressed-tensors config
    with only a sparsity entry (a pruned checkpoint, stored dense) quantizes nothing."""
    quantization = getattr(source.config(), "quantization_config", None)
    if quantization is None:
        return None
    settings = quantization if isinstance(quantization, dict) else quantization.to_dict()
    method = settings.get("quant_method", "an unknown method")
    if method == "compressed-tensors" and not settings.get("config_groups"):
        return None
    return str(method)
