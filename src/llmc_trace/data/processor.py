"""Load a model folder's own processor offline, without torchvision where it is not needed.

Calibrating on images must preprocess them as the model's processor does (its resizing, its
expansion of one image marker into as many placeholder tokens as the vision tower gives
embeddings) and lay conversations out with its chat template. `AutoProcessor` does all that,
but transformers 5 builds some processors only with torchvision installed: Qwen2-VL's checks
its video processor against a mapping that needs it, even for images. Where `AutoProcessor`
fails for that reason, the processor is built from its parts instead: the same processor class,
the tokenizer, the image processor's Pillow backend, the feature extractor and the chat
template, with the parts that need torchvision (video processors) left out. What was left out
is recorded, and refused only when that modality is asked for (`LoadedProcessor.require`).
A processor class transformers defines only with torchvision installed (Mistral 3's
`PixtralProcessor`, whose module imports the torchvision image processor) has no parts to build
from: that is one sentence saying so.

Nothing is fetched (local files only) and no code from the folder runs (remote code refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmc_trace.core.files import read_json
from llmc_trace.errors import BadInputError, DataError

#: Files that hold a processor's media part; a folder needs one of them.
PREPROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
#: Files that hold a tokenizer; a folder needs one of them.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: The processor parts each modality is preprocessed by.
MODALITY_PARTS: dict[str, tuple[str, ...]] = {
    "image": ("image_processor",),
    "video": ("video_processor",),
    "audio": ("feature_extractor", "audio_processor"),
}
#: Config fields naming each modality's placeholder token, the token a processor repeats once
#: per embedding of the media.
PLACEHOLDER_FIELDS: dict[str, tuple[str, ...]] = {
    "image": ("image_token_id", "image_token_index"),
    "video": ("video_token_id", "video_token_index"),
    "audio": ("audio_token_id", "audio_token_index"),
}


@dataclass(frozen=True)
class LoadedProcessor:
    """A model's processor and what it can preprocess.

    `built_from` is `"AutoProcessor"` or `"parts"` (see the module docstring); `unavailable`
    maps a modality the architecture has but this processor cannot preprocess to the reason.
    `placeholder_ids` maps each modality the model config names to its placeholder token id
    (read from `config.json`, not from the processor: Gemma 3's processor calls the
    begin-of-image token its `image_token_id`).
    """

    processor: Any
    folder: Path
    model_type: str
    built_from: str
    modalities: tuple[str, ...]
    placeholder_ids: dict[str, int]
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def require(self, modality: str) -> None:
        """Raise `DataError` unless this processor can preprocess `modality` for this model."""
        if modality in self.unavailable:
            raise DataError(
                f"{modality} cannot be preprocessed for {self.folder}: "
                f"{self.unavailable[modality]}",
                hint="Calibrate with another modality, or install torchvision.",
                param="modality",
            )
        if modality != "text" and modality not in self.modalities:
            raise _not_taken(self.model_type, self.folder, modality, self.modalities)


def load_processor(folder: str | Path, modality: str | None = None) -> LoadedProcessor:
    """The processor of the model in `folder`, offline; see the module docstring.

    With `modality`, a model that does not take it (a text-only model given images, an audio
    model given images) is refused first, from `config.json` alone, and so is a modality the
    processor cannot preprocess here. Raises `BadInputError` (`DataError` for the modality)
    when the folder has no processor files (naming the missing files), or when the processor
    does not load for a reason other than a missing torchvision.

    Example::

        >>> import tempfile
        >>> from llmc_trace.twins.save import save_twin
        >>> loaded = load_processor(save_twin("llava-hf/llava-1.5-7b-hf", tempfile.mkdtemp()))
        >>> loaded.built_from, loaded.modalities, loaded.placeholder_ids
        ('AutoProcessor', ('image',), {'image': 1023})
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInputError(
            f"a processor is read from a model folder, and {folder} is not one.",
            hint="Point at the folder of the checkpoint (config.json beside the processor "
            "files); a built-in's twin with a processor is written by llmc_trace.twins.save_twin.",
            param="model",
        )
    config = _read_json(folder / "config.json", folder)
    model_type = str(config.get("model_type", ""))
    placeholders = _placeholder_ids(config)
    if modality is not None and modality != "text" and modality not in placeholders:
        raise _not_taken(model_type, folder, modality, tuple(placeholders))
    _check_files(folder)
    try:
        processor = _auto_processor(folder)
        built_from, unavailable = "AutoProcessor", {}
    except ImportError as err:
        if not _needs_torchvision(err):
            raise _not_loading(folder, err) from err
        processor, unavailable = _processor_from_parts(folder, config, err)
        built_from = "parts"
    modalities = tuple(
        modality
        for modality in ("image", "video", "audio")
        if modality in placeholders
        and (
            modality in unavailable
            or any(getattr(processor, part, None) is not None for part in MODALITY_PARTS[modality])
        )
    )
    loaded = LoadedProcessor(
        processor=processor,
        folder=folder,
        model_type=model_type,
        built_from=built_from,
        modalities=modalities,
        placeholder_ids={m: placeholders[m] for m in modalities},
        unavailable=unavailable,
    )
    if modality is not None:
        loaded.require(modality)
    return loaded


def _not_taken(model_type: str, folder: Path, modality: str, takes: tuple[str, ...]) -> DataError:
    return DataError(
        f"the {model_type} model in {folder} does not take {modality} (it takes "
        f"{' and '.join(takes) or 'text only'})",
        hint="Give calibration data of a modality the model takes, or force one the model takes "
        "with --modality (modality= in Python).",
        param="modality",
    )


def _check_files(folder: Path) -> None:
    missing = []
    if not any((folder / name).is_file() for name in PREPROCESSOR_FILES):
        missing.append(" or ".join(PREPROCESSOR_FILES))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    if missing:
        raise BadInputError(
            f"the model folder {folder} has no processor: {'; and '.join(missing)} missing.",
            hint="Copy the processor files of the published checkpoint (preprocessor_config.json, "
            "the tokenizer files, the chat template) into the folder.",
            param="model",
        )


def _auto_processor(folder: Path) -> Any:
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except ImportError:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        if _needs_torchvision(err):  # AutoVideoProcessor says so with a ValueError (InternVL's)
            raise ImportError(str(err)) from err
        raise _not_loading(folder, err) from err


def _needs_torchvision(err: BaseException) -> bool:
    return "torchvision" in str(err).lower()


def _processor_from_parts(
    folder: Path, config: dict[str, Any], cause: ImportError
) -> tuple[Any, dict[str, str]]:
    """The folder's processor class, built from parts that load without torchvision."""
    import transformers
    from transformers import AutoFeatureExtractor, AutoTokenizer, AutoVideoProcessor

    settings = _processor_settings(folder)
    name = settings.pop("processor_class", None) or _processor_class_name(config)
    cls = getattr(transformers, str(name), None)
    if cls is None:
        raise _not_loading(folder, cause) from cause
    try:  # a class transformers defines only with torchvision fails here (Mistral 3's)
        attributes = cls.get_attributes()
    except ImportError as err:
        raise DataError(
            f"the processor of {folder} cannot be built here: transformers defines its {name} "
            "only when torchvision is installed, and it is not.",
            hint="Install torchvision (the build matching the installed torch) to calibrate this "
            "model on its media, or calibrate it on text with --modality text.",
            param="modality",
        ) from err
    loaders = {
        "tokenizer": lambda: AutoTokenizer.from_pretrained(folder, local_files_only=True),
        "image_processor": lambda: _pil_image_processor(folder),
        "feature_extractor": lambda: AutoFeatureExtractor.from_pretrained(
            folder, local_files_only=True
        ),
        "video_processor": lambda: AutoVideoProcessor.from_pretrained(
            folder, local_files_only=True
        ),
    }
    parts: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for attribute in attributes:
        try:
            parts[attribute] = loaders[attribute]()
        except (ImportError, OSError, ValueError, KeyError) as err:
            if not _needs_torchvision(err):
                raise _not_loading(folder, err) from err
            parts[attribute] = None
            for modality, names in MODALITY_PARTS.items():
                if attribute in names:
                    unavailable[modality] = (
                        f"its {cls.__name__} preprocesses {modality} with "
                        f"{attribute.replace('_', ' ')} code that needs torchvision, which is "
                        "not installed"
                    )
    template = _chat_template(folder)
    if template is not None:
        settings["chat_template"] = template
    settings = {k: v for k, v in settings.items() if k in _init_arguments(cls)}
    return _without_missing_parts(cls)(**parts, **settings), unavailable


def _pil_image_processor(folder: Path) -> Any:
    """The folder's image processor in its PIL backend, which needs no torchvision.
    transformers 5.24's ``AutoImageProcessor`` builds it when asked; 5.17's refuses before
    reading the folder when torchvision is missing, so there the PIL class is looked up in
    transformers' own table of each processor's backends."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(folder, local_files_only=True, backend="pil")
    except ImportError:
        cls = _pil_class(_image_processor_type(folder))
        if cls is None:
            raise
        return cls.from_pretrained(folder, local_files_only=True)


def _image_processor_type(folder: Path) -> str | None:
    """The image processor class a folder names: in ``preprocessor_config.json``, or under
    ``image_processor`` in ``processor_config.json`` (where newer releases save it)."""
    for name, key in (
        ("preprocessor_config.json", None),
        ("processor_config.json", "image_processor"),
    ):
        path = folder / name
        if not path.is_file():
            continue
        settings = _read_json(path, folder)
        settings = settings.get(key) if key else settings
        if isinstance(settings, dict) and settings.get("image_processor_type"):
            return str(settings["image_processor_type"])
    return None


def _pil_class(name: str | None) -> type | None:
    """The PIL-backend class of the image processor class ``name``, from transformers' table
    of model types to their backends' classes."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    for backends in IMAGE_PROCESSOR_MAPPING_NAMES.values():
        if isinstance(backends, dict) and name in backends.values() and backends.get("pil"):
            return getattr(transformers, backends["pil"], None)
    return None


def _without_missing_parts(cls: type) -> type:
    """`cls` accepting None for a part: its constructor checks every part's class, and for a
    video processor that check itself needs torchvision. A processor never reads a part for a
    modality it is not given."""

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument is None:
            return None
        return cls.check_argument_for_proper_class(self, argument_name, argument)

    return type(
        cls.__name__, (cls,), {"check_argument_for_proper_class": check_argument_for_proper_class}
    )


def _init_arguments(cls: type) -> set[str]:
    import inspect

    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def _processor_settings(folder: Path) -> dict[str, Any]:
    """`processor_config.json`'s arguments, with the class named by either config file."""
    settings: dict[str, Any] = {}
    preprocessor = folder / "preprocessor_config.json"
    if preprocessor.is_file():
        name = _read_json(preprocessor, folder).get("processor_class")
        if name:
            settings["processor_class"] = name
    processor = folder / "processor_config.json"
    if processor.is_file():
        settings.update(_read_json(processor, folder))
    return settings


def _processor_class_name(config: dict[str, Any]) -> str | None:
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    return PROCESSOR_MAPPING_NAMES.get(str(config.get("model_type")))


def _chat_template(folder: Path) -> str | None:
    """The chat template as transformers saves it: a `.jinja` file, else `chat_template.json`."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    stored = folder / "chat_template.json"
    if stored.is_file():
        template = _read_json(stored, folder).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def _placeholder_ids(config: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    scopes = [config, *(v for v in config.values() if isinstance(v, dict))]
    for modality, names in PLACEHOLDER_FIELDS.items():
        for scope in scopes:
            value = next((scope[n] for n in names if isinstance(scope.get(n), int)), None)
            if value is not None:
                found[modality] = value
                break
    return found


def _read_json(path: Path, folder: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BadInputError(
            f"the model folder {folder} has no {path.name}.",
            hint="Point at a checkpoint folder saved by transformers.",
            param="model",
        )
    return read_json(path)


def _not_loading(folder: Path, err: BaseException) -> BadInputError:
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return BadInputError(
        f"the processor in {folder} does not load ({first_line}).",
        hint="Check that the processor files come from the same checkpoint as config.json and "
        "load without remote code.",
        param="model",
    )
