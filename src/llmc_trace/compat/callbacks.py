"""The events a compat pipeline tells a calibration algorithm, in place of llm-compressor's session.

Under llm-compressor a modifier learns what a pipeline does through the session: calibration
starts (``calibration_epoch_start``), a sequential step's modules have seen every batch
(``sequential_epoch_end``: compress them now), calibration ends (``calibration_epoch_end``);
its hooks fire while a step calibrates and are disabled while the pipeline propagates the
compressed outputs. Here there is no session: a :class:`CalibrationCallbacks` carries the three
events as plain functions and registers the hooks, which fire only while a pipeline
calibrates (and, outside pipelines, always, as llm-compressor's do)::

    inputs = defaultdict(list)
    callbacks = CalibrationCallbacks(sequential_epoch_end=lambda modules: compress(modules))
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            callbacks.register_hook(module, lambda m, args, n=name: inputs[n].append(args[0]))
    SequentialPipeline(callbacks)(model, batches, {"sequential_targets": ["LlamaDecoderLayer"]})

:class:`Listening` turns any number of them into the
:class:`~llmc_trace.pipelines.callbacks.Callbacks` llmc-trace's own pipelines call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils.hooks import RemovableHandle

from llmc_trace.errors import BadInputError
from llmc_trace.pipelines.callbacks import NamedModules

HookType = Literal["forward_pre", "forward"]

#: Belongs to no model: a pass told to wait for it runs every batch to the end
#: (:meth:`Listening.passes`).
_NEVER_CALLED = torch.nn.Identity()


@dataclass(eq=False)  # a stateful listener: two are the same only when they are one
class CalibrationCallbacks:
    """A calibration algorithm as a compat pipeline sees it: three events and some hooks.

    ``calibration_epoch_start()`` runs once before the first batch, ``sequential_epoch_end(
    modules)`` after each sequential step's calibration pass, with the modules that step ran
    (a subgraph's, a target's, or the whole model's), before the pipeline propagates their
    outputs, and ``calibration_epoch_end()`` once at the end. ``requires_calibration_data``
    is what :meth:`~llmc_trace.compat.CalibrationPipeline.from_modifiers` reads, as it reads
    a modifier's. ``batch_index`` is the index of the batch being calibrated (llm-compressor's
    ``session.state.current_batch_idx``) and ``batch`` its model inputs (a ``loss_mask``
    among them, when the dataloader gives one).
    """

    calibration_epoch_start: Callable[[], None] | None = None
    sequential_epoch_end: Callable[[list[torch.nn.Module]], None] | None = None
    calibration_epoch_end: Callable[[], None] | None = None
    requires_calibration_data: bool = True
    batch_index: int = field(default=-1, init=False)
    batch: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _hooked: dict[int, torch.nn.Module] = field(default_factory=dict, init=False, repr=False)
    _outputs_hooked: set[int] = field(default_factory=set, init=False, repr=False)
    _handles: list[RemovableHandle] = field(default_factory=list, init=False, repr=False)
    _enabled: bool = field(default=True, init=False, repr=False)

    def register_hook(
        self,
        module: torch.nn.Module,
        hook: Callable[..., Any],
        hook_type: HookType = "forward_pre",
        *,
        with_kwargs: bool = False,
    ) -> RemovableHandle:
        """Register ``hook`` on ``module`` as torch would (``hook(module, args)`` before the
        forward, ``hook(module, args, output)`` after it; ``with_kwargs`` adds the keyword
        arguments), firing only while it is enabled: a pipeline enables it for calibration
        passes and disables it while it propagates, as llm-compressor's ``HooksMixin`` does.

        A module hooked here (until :meth:`remove_hooks`) is one a sequential pipeline
        calibrates, not only runs.
        """

        def gated(*args: Any) -> Any:
            return hook(*args) if self._enabled else None

        if hook_type == "forward_pre":
            handle = module.register_forward_pre_hook(gated, with_kwargs=with_kwargs)
        elif hook_type == "forward":
            handle = module.register_forward_hook(gated, with_kwargs=with_kwargs)
            self._outputs_hooked.add(id(module))
        else:
            raise BadInputError(
                f"hook_type must be 'forward_pre' or 'forward', got {hook_type!r}.",
                hint="Hook a module's inputs ('forward_pre') or its outputs ('forward').",
                param="hook_type",
            )
        self._hooked[id(module)] = module
        self._handles.append(handle)
        return handle

    def remove_hooks(self) -> None:
        """Remove every hook registered here."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._hooked.clear()
        self._outputs_hooked.clear()

    def listens_to(self, modules: Sequence[torch.nn.Module]) -> bool:
        """Does this algorithm calibrate any of ``modules``? Yes when it compresses at every
        step (``sequential_epoch_end``), else when one of them carries a hook of it."""
        if self.sequential_epoch_end is not None:
            return True
        return any(id(module) in self._hooked for module in modules)

    def hears_outputs_of(self, modules: Sequence[torch.nn.Module]) -> bool:
        """Does a hook of this algorithm read the outputs of any of ``modules``?"""
        return any(id(module) in self._outputs_hooked for module in modules)


@contextlib.contextmanager
def hooks_disabled(callbacks: Sequence[CalibrationCallbacks]) -> Iterator[None]:
    """The hooks of ``callbacks`` silent (while a pipeline traces the model, say: its example
    values are no calibration data), enabled again afterwards."""
    for each in callbacks:
        each._enabled = False
    try:
        yield
    finally:
        for each in callbacks:
            each._enabled = True


class Listening:
    """:class:`CalibrationCallbacks` as llmc-trace's pipelines call them (the
    :class:`~llmc_trace.pipelines.callbacks.Callbacks` protocol), for one pipeline run.

    Entering the run disables every hook and fires ``calibration_epoch_start``; a calibration
    pass enables the hooks from its ``on_subgraph_start`` to its ``on_subgraph_end``, so the
    propagation pass that follows runs unheard; ``on_calibrated`` is the step's
    ``sequential_epoch_end``. Leaving the run fires ``calibration_epoch_end`` and enables the
    hooks again.
    """

    def __init__(self, callbacks: Sequence[CalibrationCallbacks]) -> None:
        self.callbacks = list(callbacks)

    def __enter__(self) -> Listening:
        self._enable(False)
        for callbacks in self.callbacks:
            if callbacks.calibration_epoch_start is not None:
                callbacks.calibration_epoch_start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if exc_info[0] is None:
                for callbacks in self.callbacks:
                    if callbacks.calibration_epoch_end is not None:
                        callbacks.calibration_epoch_end()
        finally:
            self._enable(True)

    def wants(self, modules: NamedModules) -> bool:
        plain = [module for _, module in modules]
        return any(callbacks.listens_to(plain) for callbacks in self.callbacks)

    def passes(self, modules: NamedModules) -> list[NamedModules]:
        """One pass over the batches; when a hook reads a module's outputs, the pass also
        waits on a module the step never calls.

        A sequential pipeline that will propagate stops each calibration forward as soon as
        every module of the step has received its inputs (the outputs would be recomputed
        anyway), so the outputs of the last module called, and of the modules enclosing it,
        would never reach a hook; llm-compressor runs every calibration forward to its end.
        """
        plain = [module for _, module in modules]
        if any(callbacks.hears_outputs_of(plain) for callbacks in self.callbacks):
            return [[*modules, ("", _NEVER_CALLED)]]
        return [modules]

    def on_subgraph_start(self, index: int, modules: NamedModules) -> None:
        for callbacks in self.callbacks:
            callbacks.batch_index = -1
        self._enable(True)

    def on_batch(self, batch: dict[str, torch.Tensor]) -> None:
        for callbacks in self.callbacks:
            callbacks.batch_index += 1
            callbacks.batch = batch

    def on_calibrated(self, index: int, modules: NamedModules) -> None:
        plain = [module for _, module in modules if module is not _NEVER_CALLED]
        for callbacks in self.callbacks:
            if callbacks.sequential_epoch_end is not None:
                callbacks.sequential_epoch_end(plain)

    def on_subgraph_end(self, index: int, modules: NamedModules) -> None:
        self._enable(False)

    def _enable(self, enabled: bool) -> None:
        for callbacks in self.callbacks:
            callbacks._enabled = enabled
