"""llm-compressor's calibration pipelines, each a thin adapter over llmc-trace's own.

``CalibrationPipeline`` is the registry (``from_modifiers`` infers a pipeline as llm-compressor
does); every pipeline is called as ``pipeline(model, dataloader, dataset_args)`` and runs the
llmc-trace pipeline of the same name (:data:`~llmc_trace.pipelines.registry.PIPELINES`) on
llmc-trace's tracer and intermediates cache. What llm-compressor tells its modifiers through
the session, these tell the :class:`~llmc_trace.compat.CalibrationCallbacks` they were built
with (:mod:`llmc_trace.compat.callbacks`)::

    callbacks = CalibrationCallbacks(sequential_epoch_end=compress)
    pipeline = CalibrationPipeline.from_modifiers([callbacks])  # a SequentialPipeline
    pipeline(model, batches, {"sequential_targets": ["LlamaDecoderLayer"]})
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import torch

from llmc_trace.attempt.prove import trace_instance
from llmc_trace.compat.arguments import pipeline_arguments
from llmc_trace.compat.callbacks import CalibrationCallbacks, Listening, hooks_disabled
from llmc_trace.compat.dispatch import onload_device
from llmc_trace.core.names import BASIC, DATA_FREE, LAYER_SEQUENTIAL, SEQUENTIAL
from llmc_trace.errors import BadInputError
from llmc_trace.pipelines.calibration import Calibration
from llmc_trace.pipelines.registry import PIPELINES
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.options import TracingOptions, known_ignore
from llmc_trace.tracing.targets import plan_leaves

logger = logging.getLogger(__name__)

Pipeline = TypeVar("Pipeline", bound="type[CalibrationPipeline]")
CallbacksArgument = CalibrationCallbacks | Sequence[CalibrationCallbacks] | None


def standardize_lookup_name(name: str) -> str:
    """A pipeline name as the registry keys it: lower case, ``_`` and spaces as ``-``
    (compressed-tensors' rule, so ``layer_sequential`` and ``Layer-Sequential`` agree)."""
    return name.replace("_", "-").replace(" ", "-").lower()


class CalibrationPipeline(abc.ABC):
    """A calibration pipeline, built with the callbacks it tells what happens, and the
    registry of pipelines by name.

    ``callbacks``: one :class:`~llmc_trace.compat.CalibrationCallbacks`, several (each told
    every event, in order), or none (the pipeline then runs its forward passes unheard).
    """

    _registry: ClassVar[dict[str, type[CalibrationPipeline]]] = {}

    def __init__(self, callbacks: CallbacksArgument = None) -> None:
        if callbacks is None:
            self.callbacks: list[CalibrationCallbacks] = []
        elif isinstance(callbacks, CalibrationCallbacks):
            self.callbacks = [callbacks]
        else:
            self.callbacks = list(callbacks)

    @abc.abstractmethod
    def __call__(
        self,
        model: torch.nn.Module,
        dataloader: Iterable[Mapping[str, Any]] | None,
        dataset_args: Any,
    ) -> None:
        """Calibrate ``model`` on every batch of ``dataloader`` (dicts of model inputs);
        ``dataset_args`` is a ``DatasetArguments``, a mapping of its fields, or ``None``
        (:func:`~llmc_trace.compat.arguments.pipeline_arguments`)."""

    @classmethod
    def register(cls, name: str, alias: Sequence[str] = ()) -> Callable[[Pipeline], Pipeline]:
        """Class decorator: register a pipeline under ``name`` and each ``alias``."""

        def decorator(pipeline: Pipeline) -> Pipeline:
            for key in (name, *alias):
                cls._registry[standardize_lookup_name(key)] = pipeline
            return pipeline

        return decorator

    @classmethod
    def registered_names(cls) -> list[str]:
        """Every name and alias a pipeline is registered under, standardized."""
        return sorted(cls._registry)

    @classmethod
    def load_from_registry(cls, name: str, **constructor_kwargs: Any) -> CalibrationPipeline:
        """The pipeline registered as ``name``, built with ``constructor_kwargs``."""
        key = standardize_lookup_name(name)
        if key not in cls._registry:
            raise BadInputError(
                f"No calibration pipeline is named {name!r}.",
                hint=f"Name one of {', '.join(cls.registered_names())}.",
                param="pipeline",
            )
        return cls._registry[key](**constructor_kwargs)

    @classmethod
    def from_modifiers(
        cls, modifiers: Sequence[Any], user: str | None = None
    ) -> CalibrationPipeline:
        """The pipeline for ``modifiers`` (objects with ``requires_calibration_data``, such as
        llm-compressor's modifiers or :class:`~llmc_trace.compat.CalibrationCallbacks`):
        ``sequential`` when any needs data, else ``datafree``. A ``user`` choice wins, with a
        warning when it differs from the inferred one (``independent`` never warns).

        The modifiers that are callbacks become the pipeline's callbacks.
        """
        inferred = standardize_lookup_name(_infer_pipeline(modifiers))
        chosen = standardize_lookup_name(user) if user else inferred
        if chosen == "independent":
            inferred = chosen
        if chosen != inferred:
            logger.warning(
                "Calibration pipeline is set to `%s`, but it is recommended to use `%s`",
                chosen,
                inferred,
            )
        callbacks = [m for m in modifiers if isinstance(m, CalibrationCallbacks)]
        return cls.load_from_registry(chosen, callbacks=callbacks)


def _infer_pipeline(modifiers: Sequence[Any]) -> str:
    if any(getattr(modifier, "requires_calibration_data", False) for modifier in modifiers):
        return "sequential"
    return "datafree"


class _ProjectPipeline(CalibrationPipeline):
    """A pipeline that is llmc-trace's pipeline of the same name (``runs``) with the
    callbacks listening."""

    runs: ClassVar[str]

    def __call__(
        self,
        model: torch.nn.Module,
        dataloader: Iterable[Mapping[str, Any]] | None,
        dataset_args: Any,
    ) -> None:
        _calibrate(self.runs, model, dataloader, dataset_args, self.callbacks)


@CalibrationPipeline.register("sequential")
class SequentialPipeline(_ProjectPipeline):
    """Trace the model into subgraphs, one sequential target group each, and calibrate them in
    turn: every batch through a subgraph with the hooks on, ``sequential_epoch_end`` with its
    modules, then (``propagate_error``) every batch again with the hooks off, so the next
    subgraph sees the compressed outputs. Intermediates wait on the CPU between subgraphs.

    A model that does not trace as written is traced with the first fix that verifies (as
    :func:`llmc_trace.trace_subgraphs` does); when none does,
    :class:`~llmc_trace.errors.NotTraceableError` says where tracing stopped.
    """

    runs = SEQUENTIAL


@CalibrationPipeline.register("layer_sequential")
class LayerSequentialPipeline(_ProjectPipeline):
    """Capture the first target's inputs, then calibrate target by target, each target's
    output the next one's first argument and its other arguments (mask, rotary tables) kept.

    Needs no trace, and is exact only where that assumption holds: the pipeline checks it on
    the first batch and raises ``RuntimeError`` naming the first target that would receive
    something else (models that do work between layers); use :class:`SequentialPipeline`
    there.
    """

    runs = LAYER_SEQUENTIAL


@CalibrationPipeline.register("basic")
class BasicPipeline(_ProjectPipeline):
    """Run the whole model on every batch with the hooks on, then ``sequential_epoch_end``
    once. Needs no trace and propagates no error; every module and every hook's state is on
    the device at once."""

    runs = BASIC


@CalibrationPipeline.register("datafree", alias=["data_free"])
class DataFreePipeline(_ProjectPipeline):
    """No forward pass: ``sequential_epoch_end`` for each sequential target's modules in turn,
    then for the modules outside every target, each group on the device while it is handled.
    ``dataloader`` may be ``None``."""

    runs = DATA_FREE


@CalibrationPipeline.register("independent")
class IndependentPipeline(CalibrationPipeline):
    """Each callbacks object (each modifier) in turn, with the pipeline
    :meth:`~CalibrationPipeline.from_modifiers` infers for it alone: a data-free step and a
    calibrating one no longer share a pass, and the second calibrates the model the first
    left."""

    def __call__(
        self,
        model: torch.nn.Module,
        dataloader: Iterable[Mapping[str, Any]] | None,
        dataset_args: Any,
    ) -> None:
        batches = _batches(dataloader)
        for callbacks in self.callbacks:
            pipeline = CalibrationPipeline.from_modifiers([callbacks])
            logger.info("Inferred `%s` for %r", type(pipeline).__name__, callbacks)
            pipeline(model, batches, dataset_args)


def _calibrate(
    name: str,
    model: torch.nn.Module,
    dataloader: Iterable[Mapping[str, Any]] | None,
    dataset_args: Any,
    callbacks: list[CalibrationCallbacks],
) -> None:
    """Run llmc-trace's pipeline ``name`` on ``model`` with ``callbacks`` listening; the model
    is in eval mode for the trace and the run (dropout off, as in llm-compressor's
    calibration context)."""
    arguments = pipeline_arguments(dataset_args)
    batches = _batches(dataloader)
    if not batches and name != DATA_FREE:
        raise BadInputError(
            f"The {name} pipeline needs calibration data and the dataloader gave no batch.",
            hint="Pass a dataloader of dicts of model inputs, or use DataFreePipeline.",
            param="dataloader",
        )
    options = TracingOptions.parse(
        model,
        known_ignore(model, arguments.tracing_ignore),
        arguments.sequential_targets,
        arguments.sequential_targets_per_subgraph,
    )
    with _evaluating(model):
        if name == SEQUENTIAL:
            with hooks_disabled(callbacks):  # tracing runs modules on example values
                traced = trace_instance(model, batches[0], options)
        else:
            traced = _leaves_only(model, batches, options)
        with Listening(callbacks) as listening:
            PIPELINES[name].run(
                Calibration(
                    traced,
                    batches,
                    listening,
                    onload_device(model),
                    propagate_error=arguments.propagate_error,
                )
            )


def _batches(dataloader: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Every batch of ``dataloader`` as a dict, read once (llm-compressor also caches every
    batch before the first forward pass)."""
    if dataloader is None:
        return []
    batches = []
    for batch in dataloader:
        if not isinstance(batch, Mapping):
            raise BadInputError(
                f"A batch must map input names to values; got {type(batch).__name__}.",
                hint="Yield dicts from the dataloader, e.g. {'input_ids': ..., "
                "'attention_mask': ...}.",
                param="dataloader",
            )
        batches.append(dict(batch))
    return batches


def _leaves_only(
    model: torch.nn.Module, batches: list[dict[str, Any]], options: TracingOptions
) -> TracedModel:
    """The model for a pipeline that runs no graph (layer_sequential, basic, data_free): they
    read only the leaf plan (which modules are the targets), so nothing is traced and neither
    a partition nor a failure is recorded."""
    targets = None if options.sequential_targets is None else list(options.sequential_targets)
    return TracedModel(
        name=type(model).__name__,
        model=model,
        sample=batches[0] if batches else {},
        options=options,
        leaves=plan_leaves(model, targets, list(options.ignored_modules)),
        partitioned=None,
        failure=None,
    )


@contextlib.contextmanager
def _evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode, each module's own mode restored afterwards."""
    training = [module for module in model.modules() if module.training]
    for module in training:
        module.training = False
    try:
        yield
    finally:
        for module in training:
            module.training = True
