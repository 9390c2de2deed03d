"""One model type of ``coverage --all``: its twin, a sample of each modality, trace, verify, fix.

The type is built from its config class's defaults shrunk to a tiny twin. A default that
transformers cannot build or run is a fact about that default, not about the architecture: where
a built-in published config of the type exists (``llmc-trace coverage`` lists them), the type is
swept again from it, shrunk as ``attempt`` shrinks it, and each row names the config it came
from. Each row says what happened and where:

* ``verified``: traced and replayed exactly, with the fix it needed if any;
* ``not_traceable``: tracing stopped, located as ``attempt`` locates it (kind, file and line,
  module) after the fix search;
* ``mismatch``: traced, but the replay differs from eager;
* ``twin``, ``sample``, ``timeout``: ours too: the shrunk twin could not be built or run where
  the full-size model can; no sample of the modality could be built, or the forward needs an
  input none has, or a sample probed from the model (:mod:`llmc_trace.traced.probe`) runs at
  neither size (a sample we guessed cannot put the blame on transformers); or the type ran
  past :data:`TYPE_TIMEOUT_S` CPU seconds;
* ``not_standalone``: the class has no forward a calibration can run on its own (a wrapper
  that only generates, a draft model reading its main model's states:
  :mod:`llmc_trace.attempt.standalone`): listed apart, not counted, and nothing built;
* ``transformers``: transformers itself cannot build the config, or run it eagerly at full
  size (on ``meta``, operation by operation, see
  :class:`~llmc_trace.tracing.values.MixedExecution`), with a sample built from the config
  alone or with text already failing so: listed apart, with its own error, and not counted
  against the tracer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

from llmc_trace.traced.settle import settle
from llmc_trace.attempt.standalone import not_standalone
from llmc_trace.errors import LlmcTraceError
from llmc_trace.models.build import build_meta_model_of, twin_of_class
from llmc_trace.models.defaults import default_config
from llmc_trace.models.samples import SampleOptions, has_builder, supported_modalities
from llmc_trace.models.source import builtin_names_of_type, builtin_read_as, resolve_model
from llmc_trace.traced.model import trace_model
from llmc_trace.traced.probe import UnfitConfig, sample_for
from llmc_trace.traced.twin import verify_on_sample
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import concrete_arguments
from llmc_trace.tracing.values import MixedExecution

#: Outcomes that are transformers' own, not the tracer's: listed apart, never counted.
NOT_STANDALONE = "not_standalone"
NOT_COUNTED = ("transformers", NOT_STANDALONE)
#: The ``config`` of a row swept from the type's config class's own defaults.
DEFAULT = "default"
#: Outcomes that say the config did not run, not where the tracer failed: a built-in config
#: of the type is tried for these modalities.
DID_NOT_RUN = ("transformers", "sample")
#: A short sequence: the twin's code paths do not depend on its length, its seconds do.
SAMPLE = SampleOptions(seq_len=16)
#: CPU seconds one model type may take (build, every modality, fix search, a built-in config
#: after the default) before it is abandoned.
TYPE_TIMEOUT_S = 60


@dataclass(frozen=True)
class SweepRow:
    """One model type and modality, the config it was built from (:data:`DEFAULT` or a
    built-in's name), and what became of it (see the module docstring). ``decisions`` counts
    the decisions of the trace it settled on by ``"<kind> <status>"``; ``unguarded`` lists
    where a data-dependent one was left to no opaque call (``file:line``)."""

    model_type: str
    model_class: str
    config: str
    modality: str
    outcome: str
    fix: str
    problem: str
    subgraphs: int
    seconds: float
    decisions: dict[str, int] = field(default_factory=dict)
    unguarded: list[str] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return self.outcome == "verified"

    @property
    def counted(self) -> bool:
        return self.outcome not in NOT_COUNTED


class TypeTimeout(BaseException):
    """A model type ran past :data:`TYPE_TIMEOUT_S`.

    A ``BaseException``, as ``KeyboardInterrupt`` is: the tracer and model code catch
    ``Exception`` to try another way, and would swallow it.
    """


def sweep_type(model_type: str, class_name: str, *, fix: bool = True) -> list[SweepRow]:
    """Sweep ``model_type`` from its default config; each modality the default did not run
    (:data:`DID_NOT_RUN`) again from each built-in config of the type, until one runs it."""
    cls = getattr(transformers, class_name)
    reason = not_standalone(cls)
    if reason is not None:
        return [SweepRow(model_type, class_name, DEFAULT, "-", NOT_STANDALONE, "", reason, 0, 0.0)]
    swept = DEFAULT
    start = time.perf_counter()
    try:
        with _time_limit(TYPE_TIMEOUT_S):
            rows = _sweep_config(model_type, cls, DEFAULT, _config_of(model_type, DEFAULT), fix)
            for name in builtin_names_of_type(model_type):
                if all(row.outcome not in DID_NOT_RUN for row in rows):
                    break
                swept = name
                instead = _sweep_config(model_type, cls, name, _config_of(model_type, name), fix)
                rows = _ran_instead(rows, instead)
            return rows
    except TypeTimeout:
        return [_timed_out(model_type, class_name, swept, start)]


def resweep(
    model_type: str, class_name: str, config: str, modalities: list[str], *, fix: bool = True
) -> list[SweepRow]:
    """Sweep only ``modalities`` of ``model_type``, from the config a shipped row names
    (:data:`DEFAULT` or a built-in): CI's second look at what verified, with no time spent on
    the default config where a built-in was needed, nor on modalities that did not verify."""
    cls = getattr(transformers, class_name)
    start = time.perf_counter()
    try:
        with _time_limit(TYPE_TIMEOUT_S):
            make_config = _config_of(model_type, config)
            return _sweep_config(model_type, cls, config, make_config, fix, modalities)
    except TypeTimeout:
        return [_timed_out(model_type, class_name, config, start)]


def _config_of(model_type: str, config: str) -> Callable[[], PretrainedConfig]:
    """What makes the config a row names: the type's defaults, or a built-in's (read into the
    type's own config class where the built-in's ``SOURCES.json`` entry says the type reads it)."""
    if config == DEFAULT:
        return functools.partial(default_config, model_type)
    if config in builtin_read_as().get(model_type, []):
        return functools.partial(resolve_model(config).config, model_type)
    return resolve_model(config).config


def _built_from(config: PretrainedConfig, cls: type[PreTrainedModel]) -> PretrainedConfig:
    """The part of ``config`` that ``cls`` is built from: ``config`` itself, or the sub-config
    of ``cls``'s config class a composite holds (MusicGen's decoder for ``MusicgenForCausalLM``,
    a published Qwen2.5-Omni config's thinker for the thinker's class)."""
    wanted = cls.config_class
    if wanted is None or isinstance(config, wanted):
        return config
    pending = [config]
    while pending:
        for value in vars(pending.pop(0)).values():
            if isinstance(value, wanted):
                return value
            if isinstance(value, PretrainedConfig):
                pending.append(value)
    return config


def _timed_out(model_type: str, class_name: str, config: str, start: float) -> SweepRow:
    elapsed = round(time.perf_counter() - start, 2)
    problem = f"over {TYPE_TIMEOUT_S} CPU seconds"
    return SweepRow(model_type, class_name, config, "-", "timeout", "", problem, 0, elapsed)


def _ran_instead(rows: list[SweepRow], instead: list[SweepRow]) -> list[SweepRow]:
    """``rows`` with each one that did not run replaced by the row ``instead`` has for its
    modality, where that one ran; every row of ``instead`` where the config itself did not
    build (modality ``-``) and ``instead`` ran anything."""
    ran = {row.modality: row for row in instead if row.outcome not in DID_NOT_RUN}
    if any(row.modality == "-" for row in rows):
        return instead if ran else rows
    return [ran.get(row.modality, row) if row.outcome in DID_NOT_RUN else row for row in rows]


def _sweep_config(
    model_type: str,
    cls: type[PreTrainedModel],
    name: str,
    make_config: Callable[[], PretrainedConfig],
    fix: bool,
    modalities: list[str] | None = None,
) -> list[SweepRow]:
    """Build the twin of ``make_config()`` and sweep each modality ``cls`` takes (of
    ``modalities``, when given)."""
    start = time.perf_counter()

    def row(
        modality: str, outcome: str, problem: str = "", fix_used: str = "", count: int = 0
    ) -> SweepRow:
        elapsed = round(time.perf_counter() - start, 2)
        return SweepRow(
            model_type, cls.__name__, name, modality, outcome, fix_used, problem, count, elapsed
        )

    try:
        config = _built_from(make_config(), cls)
    except Exception as err:  # noqa: BLE001 - transformers' own verdict on the config
        return [row("-", "transformers", _said(err))]
    try:
        twin = twin_of_class(cls, config)
    except ImportError as err:  # an optional dependency transformers needs for it
        return [row("-", "transformers", _said(err))]
    except Exception as err:  # noqa: BLE001 - whose fault: the full size decides
        full = _full_size_failure(cls, config)
        if full is not None:
            return [row("-", "transformers", _said(full))]
        return [row("-", "twin", f"twin does not build: {_said(err)}")]
    rows: list[SweepRow] = []
    for modality in supported_modalities(twin.config, cls):
        if modalities is not None and modality not in modalities:
            continue
        text_broken = any(r.modality == "text" and not r.counted for r in rows)
        rows.append(_sweep_modality(cls, config, twin, modality, fix, row, text_broken))
        start = time.perf_counter()  # each modality's own seconds (build: the first's)
    return rows


def _sweep_modality(
    cls: type[PreTrainedModel],
    config: PretrainedConfig,
    twin: PreTrainedModel,
    modality: str,
    fix: bool,
    row: Callable[..., SweepRow],
    text_broken: bool,
) -> SweepRow:
    """One modality's row. ``text_broken``: transformers could not run this config on text,
    so a probed sample that fails too does not show a failure of ours."""
    probed = not has_builder(twin.config, modality)
    try:
        sample = sample_for(twin, modality, SAMPLE)
    except UnfitConfig as err:  # the config's, unless the shrink made it so
        full = _full_size_failure(cls, config, modality)
        if isinstance(full, UnfitConfig):
            return row(modality, "transformers", _said(full))
        return row(modality, "twin", f"twin does not take {modality}: {_said(err)}")
    except Exception as err:  # noqa: BLE001 - no sample built: is it the twin's doing?
        full = _full_size_failure(cls, config, modality)
        if full is None:
            return row(modality, "twin", f"twin takes no {modality} sample: {_said(err)}")
        broken = text_broken or isinstance(full, UnfitConfig)
        return row(modality, "transformers" if broken else "sample", _said(full if broken else err))
    missing = _required_inputs(twin, sample)
    if missing:
        return row(modality, "sample", f"forward requires {', '.join(missing)}; no sample has it")
    options = TracingOptions.parse(twin, [], None)
    options = dataclasses.replace(options, record_decisions=True)
    traced = trace_model(twin, sample, options, name=type(twin).__name__)
    # Verification runs the eager forward itself: only a trace that does not verify as it is
    # asks whether the twin runs eagerly at all (whose failure it is) before fixes are searched.
    settled = settle(traced, verify_on_sample, fix=False)
    if not settled.attempt.ok:
        twin_error = _eager_error(twin, sample)
        if twin_error is not None:
            full = _full_size_failure(cls, config, modality)
            if full is None:
                return row(modality, "twin", f"twin does not run: {twin_error}")
            if probed and not text_broken and not isinstance(full, UnfitConfig):
                problem = f"the probed sample runs at neither size: {_said(full)}"
                return row(modality, "sample", problem)
            return row(modality, "transformers", _said(full))
        if fix:
            settled = settle(traced, verify_on_sample, fix=True, proved=settled.first)
    attempt = settled.attempt
    fix_used = ", ".join(settled.applied.tracing_ignore) if settled.applied else ""
    if attempt.ok:
        made = row(modality, "verified", "", fix_used, len(attempt.traced.subgraphs))
    elif attempt.traced.failure is not None:
        failure = attempt.traced.failure  # a replay's failure the search could not fix too
        where = f" at {failure.location}" if failure.location else ""
        inside = f" in {failure.module_path} ({failure.module_class})"
        made = row(modality, "not_traceable", f"{failure.kind}{where}{inside}")
    else:
        problems = attempt.check.verification.problems if attempt.check else []
        made = row(modality, "mismatch", "; ".join(problems)[:300], fix_used)
    counts: dict[str, int] = {}
    for decision in attempt.traced.decisions:
        key = f"{decision.kind} {decision.status}"
        counts[key] = counts.get(key, 0) + 1
    unguarded = [f"{d.file}:{d.line}" for d in attempt.traced.decisions if d.unguarded]
    return dataclasses.replace(made, decisions=dict(sorted(counts.items())), unguarded=unguarded)


def _required_inputs(model: torch.nn.Module, sample: dict[str, Any]) -> list[str]:
    """Parameters of ``forward`` without a default that the sample does not give."""
    parameters = inspect.signature(model.forward).parameters.values()
    return [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in sample
    ]


def _eager_error(model: torch.nn.Module, sample: dict[str, Any]) -> str | None:
    try:
        with torch.no_grad():
            model(**sample, **concrete_arguments(model, {}))
    except Exception as err:  # noqa: BLE001 - any error is the verdict
        return _said(err)
    return None


def _full_size_failure(
    cls: type[PreTrainedModel], config: PretrainedConfig, modality: str | None = None
) -> Exception | None:
    """transformers' own error when it cannot build the full-size model or (given a
    ``modality``) run it eagerly: on ``meta``, reading values through phantoms, so no memory
    and no arithmetic at full size. Only asked after the twin failed: the answer says whose
    failure that was. Media come in the model's own dtype (:func:`sample_for`'s): a model that
    leaves that cast to its caller would fail on float32 pixels for a reason of ours."""
    try:
        full = build_meta_model_of(cls, copy.deepcopy(config))
        if modality is None:
            return None
        with torch.no_grad(), MixedExecution():
            full(**sample_for(full, modality, SAMPLE), **concrete_arguments(full, {}))
    except Exception as err:  # noqa: BLE001 - any error is the verdict
        return err
    return None


def _said(err: BaseException) -> str:
    """The first line of an error, as transformers (or we) said it."""
    text = err.message if isinstance(err, LlmcTraceError) else str(err)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(err).__name__}: {first}"[:300]


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """Raise :class:`TypeTimeout` in this (main) thread after ``seconds`` of its process's CPU
    time: on a machine shared with other work, wall time would time out whatever ran beside
    the busiest neighbours."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TypeTimeout

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
