"""``CompressRequest``: every input of a compression run, and ``validate``, which checks it
against the files once, before any heavy work.

A request is a model, an output folder and the run's options in their sections
(:mod:`~llmc_trace.spec.settings`, :class:`~llmc_trace.spec.stage.Stage`); a recipe is
its serialised form (:mod:`~llmc_trace.spec.recipe`), and the command line's flags are
overrides on it (:meth:`CompressRequest.with_options`). Options are given by name, flat, and
find their section through their declarations, so no option is listed here. Constructing a
request checks the options among themselves and touches no file, so a request can be built,
compared and serialised anywhere; :func:`validate` reads what it names (the model's config and
weights, the output folder, the dataset) and is the first step of ``compress()`` and of the
command line.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmc_trace.core.names import AUTO, CALIBRATED_METHODS, MODALITIES
from llmc_trace.data import validate_source
from llmc_trace.data.multimodal import source_modality
from llmc_trace.data.processor import load_processor
from llmc_trace.errors import BadInputError
from llmc_trace.models.samples import check_seq_len
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.core.files import check_parent_folders
from llmc_trace.models.tokenizer import load_tokenizer
from llmc_trace.models.weights import check_weight_files
from llmc_trace.core.declare import Declared, build, declared, replace
from llmc_trace.spec.recipe import RECIPE_HEADER, Recipe, read_recipe
from llmc_trace.spec.settings import (
    SECTIONS,
    CalibrationSettings,
    CheckpointSettings,
    TracingSettings,
)
from llmc_trace.spec.stage import Stage, check_order

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: the modalities whose rows go through the model's processor
MEDIA = tuple(m for m in MODALITIES if m != "text")

#: The data kind of a run whose stages all compress from the weights alone, given no dataset.
NO_DATA = "none"


@dataclass(frozen=True, init=False)
class CompressRequest:
    """What to compress, how, and where to; constructing one checks the options, and
    :func:`validate` the files they name.

    ``model``: a folder with weights. ``dataset``: the calibration data. ``out_dir=None``
    compresses in memory only (for evaluation). Every other option is a keyword named as its
    declaration names it (``samples=8``, ``scheme="W4A16"``, ``sparsity="2:4"``,
    ``tracing_ignore=[...]``: see ``llmc-trace compress --help``, or the fields of
    :class:`~llmc_trace.spec.settings.CalibrationSettings`, ``TracingSettings``,
    ``CheckpointSettings`` and :class:`~llmc_trace.spec.stage.Stage`). The stage's options
    describe one stage; ``stages`` lists several instead (e.g. SparseGPT 2:4 then GPTQ
    W4A16), and after construction always holds the stages that will run.

    Construction raises :class:`~llmc_trace.errors.BadInputError` naming the parameter for
    names and combinations, and reads no file; :func:`validate` raises it for the model's
    weights, the output folder and the dataset's shape. ``source`` (the resolved model) and
    ``data_kind`` are read from the files when first asked for, which ``validate`` does.

    >>> CompressRequest("tiny-llama/", "calib.npy", "out/", samples=64, scheme="W8A16")  # doctest: +SKIP
    """

    model: str | Path | ModelSource
    out_dir: str | Path | None
    overwrite: bool
    calibration: CalibrationSettings
    tracing: TracingSettings
    checkpoint: CheckpointSettings
    stages: tuple[Stage, ...]
    out_path: Path | None = field(repr=False)

    def __init__(
        self,
        model: str | Path | ModelSource,
        dataset: str | Path | None = None,
        out_dir: str | Path | None = None,
        *,
        overwrite: bool = False,
        stages: Sequence[Stage] | None = None,
        **options: Any,
    ) -> None:
        if dataset is not None:
            options["dataset"] = dataset
        grouped = group_options(options)
        stage_options = grouped.pop("stages")
        if stages is None:
            stages = (build(Stage, stage_options),)
        elif stage_options:
            given = next(iter(stage_options))
            raise BadInputError(
                f"{', '.join(stage_options)} describe one stage, and stages were given too.",
                hint="Put them in the stages (or give no stages).",
                param=given,
            )
        sections = {name: SECTIONS[name](**values) for name, values in grouped.items()}
        self._set(model, out_dir, overwrite, sections, tuple(stages))

    def _set(
        self,
        model: str | Path | ModelSource,
        out_dir: str | Path | None,
        overwrite: bool,
        sections: Mapping[str, Any],
        stages: tuple[Stage, ...],
    ) -> None:
        """Assign every field and check the options among themselves (no file is read)."""
        check_order(stages)
        calibration: CalibrationSettings = sections["calibration"]
        if out_dir is not None and not any(s.quantizes or s.prunes for s in stages):
            raise BadInputError(
                f"no stage quantizes or prunes ({', '.join(s.method for s in stages)}): the "
                "checkpoint would be the model uncompressed.",
                hint="SmoothQuant prepares the weights for a quantizing stage after it: give a "
                "--recipe with both, e.g. `stages: [{method: smoothquant}, {method: gptq, "
                "scheme: W8A8}]`.",
                param="method",
            )
        calibrated = [s.method for s in stages if s.method in CALIBRATED_METHODS]
        if calibration.dataset is None and calibrated:
            raise BadInputError(
                f"no calibration data given, and {calibrated[0]} calibrates on data.",
                hint="Pass --dataset (a .npy token array, a text file or a hub id), or a "
                "--recipe that names one (rtn and magnitude need none).",
                param="dataset",
            )
        values = {
            "model": model,
            "out_dir": out_dir,
            "overwrite": overwrite,
            **sections,
            "stages": stages,
            "out_path": Path(out_dir) if out_dir is not None else None,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @cached_property
    def source(self) -> ModelSource:
        """The model, resolved (its config read): bad input for a name that is none."""
        model = self.model
        return model if isinstance(model, ModelSource) else resolve_model(str(model))

    @cached_property
    def data_kind(self) -> str:
        """What the dataset is: ``npy`` token ids, a text file, a hub dataset, or the media
        modality (``image``, ``video``, ``audio``) of rows that go through the model's
        processor; read from the dataset, which is checked on the way (:func:`validate`).
        ``none`` where a run of data-free stages names no dataset."""
        if self.calibration.dataset is None:
            return NO_DATA
        return _check_data(self.calibration, self.source)

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The model folder's tokenizer, which text data is read with (``None`` for token ids
        and media rows, whose processor holds its own): loaded once, when :func:`validate`
        checks it before anything heavy, and kept for the run."""
        if self.data_kind in ("npy", NO_DATA) or self.modality != "text":
            return None
        return load_tokenizer(self.source.weights_folder("compress"))

    @property
    def modality(self) -> str:
        """What the calibration rows hold: ``text``, or the media they carry."""
        return self.data_kind if self.data_kind in MEDIA else "text"

    @property
    def needs_data(self) -> bool:
        return any(stage.method in CALIBRATED_METHODS for stage in self.stages)

    @classmethod
    def from_recipe(
        cls,
        recipe: str | Path | Recipe,
        model: str | Path | ModelSource,
        out_dir: str | Path | None = None,
        *,
        overwrite: bool = False,
        **overrides: Any,
    ) -> CompressRequest:
        """The request a recipe describes, with ``overrides`` (options by name, as
        :class:`CompressRequest` takes them) in the place of its values.

        A stage option changes the stage of a one-stage recipe; one that applies to every
        stage (``ignore``) changes each stage that quantizes. A sparsity given without a
        method lets the stage's method follow it (SparseGPT).

        >>> CompressRequest.from_recipe("out/recipe.yaml", "tiny-llama/", "again/")  # doctest: +SKIP
        """
        read = recipe if isinstance(recipe, Recipe) else read_recipe(recipe)
        grouped = group_options(overrides)
        stages = _override_stages(read.stages, grouped.pop("stages"))
        sections = {
            name: dataclasses.replace(getattr(read, name), **values)
            for name, values in grouped.items()
        }
        request = cls.__new__(cls)
        request._set(model, out_dir, overwrite, sections, stages)
        return request

    def recipe(self) -> Recipe:
        """This request's options as a recipe (what ``recipe.yaml`` serialises)."""
        return Recipe(self.calibration, self.tracing, self.checkpoint, self.stages)


def validate(request: CompressRequest) -> None:
    """Check ``request`` against the files it names, before any heavy work: the model is a
    folder with sound weights and room for ``seq_len`` tokens, the output folder is free (or,
    with ``overwrite``, a checkpoint this tool wrote), and the dataset is one the run can
    read. Raises :class:`~llmc_trace.errors.BadInputError` naming the parameter."""
    source = request.source
    # headers only: pickles, truncation, lost shards
    check_weight_files(source.weights_folder("compress"))
    check_seq_len(source.config(), request.calibration.seq_len)
    if request.out_path is not None:
        check_output(request.out_path, overwrite=request.overwrite)
    request.data_kind  # noqa: B018 - read and checked here, kept for the run
    request.tokenizer  # noqa: B018 - text data's tokenizer: loaded here, before the model


def _check_data(calibration: CalibrationSettings, source: ModelSource) -> str:
    """The dataset's kind, checked before anything heavy: media rows (their modality detected
    from the columns, or forced) need a processor in the model folder that takes them; token
    ids and texts are checked as the text loader reads them."""
    assert calibration.dataset is not None and source.folder is not None
    forced = None if calibration.modality == AUTO else calibration.modality
    choice = source_modality(calibration.dataset, forced, calibration.columns())
    if choice is None:
        data = validate_source(
            calibration.dataset,
            samples=calibration.samples,
            seq_len=calibration.seq_len,
            column=calibration.text_column,
        )
        named = {
            "text_column": calibration.text_column,
            "image_column": calibration.image_column,
            "audio_column": calibration.audio_column,
        }
        given = [name for name, value in named.items() if value is not None]
        if data.kind == "npy" and given:
            flag = "--" + given[0].replace("_", "-")
            raise BadInputError(
                f"{calibration.dataset} holds token ids, which have no columns for {flag} to name.",
                hint=f"Drop {flag}, or give the rows it names (a .jsonl, .json or .parquet "
                "file, or a hub dataset).",
                param=given[0],
            )
        return data.kind
    load_processor(source.folder, choice.modality).require(choice.modality)
    return choice.modality


def check_output(out: Path, *, overwrite: bool) -> None:
    """``out`` is free, or (with ``overwrite``) a checkpoint folder this tool wrote: its
    ``recipe.yaml`` says so. A file, a link, or a folder of anything else is never replaced
    (nothing is deleted before the new checkpoint is complete either way)."""
    check_parent_folders(out)
    if not out.exists() and not out.is_symlink():
        return
    if not out.exists():  # a link to nothing: --overwrite would refuse a link anyway
        raise BadInputError(
            f"{out} is a link to {os.readlink(out)}, which does not exist.",
            hint="Choose another --out, or remove the link.",
            param="out",
        )
    if not overwrite:
        raise BadInputError(
            f"the output folder {out} already exists.",
            hint="Choose another --out, or pass --overwrite (overwrite=True from Python).",
            param="out",
        )
    recipe = out / "recipe.yaml"
    written = (
        out.is_dir()
        and not out.is_symlink()
        and recipe.is_file()
        and recipe.read_text(errors="replace").startswith(RECIPE_HEADER)
    )
    if not written:
        what = "a link" if out.is_symlink() else "a folder" if out.is_dir() else "a file"
        raise BadInputError(
            f"--overwrite replaces only a checkpoint llmc-trace wrote, and {out} is {what} "
            "without its recipe.yaml.",
            hint="Choose another --out, or remove it yourself if it is yours to remove.",
            param="out",
        )


def group_options(options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``options`` by name -> ``{section: {name: value}}`` for every section of
    :data:`~llmc_trace.spec.settings.SECTIONS` (``stages`` for a stage's). A renamed
    option is taken under its new name with a warning; an unknown one is bad input naming
    the closest."""
    by_name, renamed = _declared_names()
    grouped: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for name, value in options.items():
        if name not in by_name and name in renamed:
            new = renamed[name]
            warnings.warn(f"{name} is now called {new}; use {new}.", FutureWarning, stacklevel=3)
            name = new
        if name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=3)
            raise BadInputError(
                f"unknown option {name!r}.",
                hint=f"Did you mean {', '.join(close)}?" if close else "See compress --help.",
                param=name,
            )
        grouped[by_name[name][0]][name] = value
    return grouped


def _declared_names() -> tuple[dict[str, tuple[str, Declared]], dict[str, str]]:
    """Every option's name -> (its section, its declaration), and earlier names -> new."""
    by_name: dict[str, tuple[str, Declared]] = {}
    renamed: dict[str, str] = {}
    for section, dataclass_type in SECTIONS.items():
        for entry in declared(dataclass_type):
            by_name[entry.name] = (section, entry)
            renamed.update({old: entry.name for old in entry.option.renamed_from})
    return by_name, renamed


def _override_stages(stages: tuple[Stage, ...], changes: dict[str, Any]) -> tuple[Stage, ...]:
    """The recipe's stages with command-line ``changes`` (see :meth:`CompressRequest.from_recipe`)."""
    if not changes:
        return stages
    options = {entry.name: entry.option for entry in declared(Stage)}
    every = {name: value for name, value in changes.items() if options[name].every_stage}
    one = {name: value for name, value in changes.items() if name not in every}
    if one and len(stages) != 1:
        raise BadInputError(
            f"{', '.join('--' + name.replace('_', '-') for name in one)} "
            f"{'changes' if len(one) == 1 else 'change'} one stage, and the recipe has "
            f"{len(stages)}.",
            hint="Edit the recipe's stages instead.",
            param=next(iter(one)),
        )
    if "sparsity" in one and "method" not in one:
        one["method"] = AUTO
    changed = list(stages)
    if one:
        changed[0] = replace(changed[0], one)
    if every:
        quantizing = [index for index, stage in enumerate(changed) if stage.quantizes]
        if not quantizing:
            raise BadInputError(
                f"--{next(iter(every))} keeps layers out of quantization, and this run only "
                "prunes.",
                hint="Leave it out, or give the run a --scheme.",
                param=next(iter(every)),
            )
        for index in quantizing:
            changed[index] = replace(changed[index], every)
    return tuple(changed)
