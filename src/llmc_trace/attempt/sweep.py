"""``coverage --all``: trace every generative model type of the installed transformers.

A user asks "does my architecture trace?" before downloading 100 GB, and every transformers
release may break an architecture no built-in covers. So each model type of transformers'
generative auto mappings (:func:`~llmc_trace.models.defaults.generative_types`) is built from
its config class's defaults shrunk to a tiny twin, given a sample for every modality it takes,
traced with the default sequential targets, replayed against its own eager forward, and on a
failure fixed as ``attempt --fix`` would. Each row says what happened and where:

* ``verified``: traced and replayed exactly, with the fix it needed if any;
* ``not_traceable``: tracing stopped, located as ``attempt`` locates it (kind, file and line,
  module) after the fix search;
* ``mismatch``: traced, but the replay differs from eager;
* ``twin``, ``sample``, ``timeout``: ours too: the shrunk twin could not be built or run where
  the full-size model can, the forward needs an input no sample builder makes, or the type
  ran past :data:`TYPE_TIMEOUT_S` CPU seconds;
* ``transformers``: transformers itself cannot build the default config, or run it eagerly at
  full size (on ``meta``, operation by operation, see
  :class:`~llmc_trace.tracing.values.MixedExecution`): listed apart, with its own error, and
  not counted against the tracer.

Types run in worker processes (one torch thread each), so the sweep's time is the slowest
worker's share; the rows come back sorted, whatever order the workers finish in.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import multiprocessing
import resource
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig, PreTrainedModel

from llmc_trace.attempt.run import settle
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import LlmcTraceError
from llmc_trace.models.build import build_meta_model_of, twin_of_class
from llmc_trace.models.defaults import default_config, generative_types
from llmc_trace.models.samples import SampleOptions, make_sample, supported_modalities
from llmc_trace.traced.model import trace_model
from llmc_trace.traced.twin import verify_on_sample
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.trace import concrete_arguments
from llmc_trace.tracing.values import MixedExecution

#: Outcomes that are transformers' own, not the tracer's: listed apart, never counted.
NOT_COUNTED = ("transformers",)
#: A short sequence: the twin's code paths do not depend on its length, its seconds do.
SAMPLE = SampleOptions(seq_len=16)
#: CPU seconds one model type may take (build, every modality, fix search) before it is
#: abandoned.
TYPE_TIMEOUT_S = 60


@dataclass(frozen=True)
class SweepRow:
    """One model type and modality, and what became of it (see the module docstring)."""

    model_type: str
    model_class: str
    modality: str
    outcome: str
    fix: str
    problem: str
    subgraphs: int
    seconds: float

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


def sweep(
    model_types: list[str] | None = None,
    *,
    fix: bool = True,
    workers: int = 2,
    progress: Progress | None = None,
) -> list[SweepRow]:
    """Sweep ``model_types`` (default: every generative type) in ``workers`` processes."""
    report_progress = progress or no_progress
    known = generative_types()
    chosen = model_types or list(known)
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise ValueError(f"not generative model types of this transformers: {unknown}")
    rows: list[SweepRow] = []
    if workers <= 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in a worker: twins are too small to share out
        try:
            for index, model_type in enumerate(chosen):
                report_progress(model_type, index, len(chosen))
                rows.extend(sweep_type(model_type, known[model_type], fix=fix))
        finally:
            torch.set_num_threads(threads)
    else:
        context = multiprocessing.get_context("fork")  # the parent's imports come for free
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_one_thread) as pool:
            futures = [pool.submit(sweep_type, t, known[t], fix=fix) for t in chosen]
            for done, future in enumerate(as_completed(futures)):
                rows.extend(future.result())
                report_progress(rows[-1].model_type, done + 1, len(chosen))
    report_progress("done", len(chosen), len(chosen))
    return sorted(rows, key=lambda row: (row.model_type, row.modality))


def sweep_type(model_type: str, class_name: str, *, fix: bool = True) -> list[SweepRow]:
    """Build ``model_type``'s twin from its default config and sweep each of its modalities."""
    start = time.perf_counter()

    def row(
        modality: str, outcome: str, problem: str = "", fix_used: str = "", count: int = 0
    ) -> SweepRow:
        elapsed = round(time.perf_counter() - start, 2)
        return SweepRow(
            model_type, class_name, modality, outcome, fix_used, problem, count, elapsed
        )

    try:
        with _time_limit(TYPE_TIMEOUT_S):
            cls = getattr(transformers, class_name)
            try:
                config = default_config(model_type)
            except Exception as err:  # noqa: BLE001 - transformers' own verdict on its default
                return [row("-", "transformers", _said(err))]
            try:
                twin = twin_of_class(cls, config)
            except ImportError as err:  # an optional dependency transformers needs for it
                return [row("-", "transformers", _said(err))]
            except Exception as err:  # noqa: BLE001 - whose fault: the full size decides
                full_error = _full_size_error(cls, config)
                if full_error is not None:
                    return [row("-", "transformers", full_error)]
                return [row("-", "twin", f"twin does not build: {_said(err)}")]
            rows = []
            for modality in supported_modalities(twin.config):
                rows.append(_sweep_modality(cls, config, twin, modality, fix, row))
                start = time.perf_counter()  # each modality's own seconds (build: the first's)
            return rows
    except TypeTimeout:
        return [row("-", "timeout", f"over {TYPE_TIMEOUT_S} CPU seconds")]


def _sweep_modality(
    cls: type[PreTrainedModel],
    config: PretrainedConfig,
    twin: PreTrainedModel,
    modality: str,
    fix: bool,
    row: Callable[..., SweepRow],
) -> SweepRow:
    try:
        sample = make_sample(twin.config, modality, SAMPLE)
    except Exception as err:  # noqa: BLE001 - no sample of this modality can be built here
        return row(modality, "sample", _said(err))
    missing = _required_inputs(twin, sample)
    if missing:
        return row(modality, "sample", f"forward requires {', '.join(missing)}; no sample has it")
    twin_error = _eager_error(twin, sample)
    if twin_error is not None:
        full_error = _full_size_error(cls, config, modality)
        if full_error is not None:
            return row(modality, "transformers", full_error)
        return row(modality, "twin", f"twin does not run: {twin_error}")
    options = TracingOptions.parse(twin, [], None)
    traced = trace_model(twin, sample, options, name=type(twin).__name__)
    settled = settle(traced, verify_on_sample, fix=fix)
    attempt = settled.attempt
    fix_used = ", ".join(settled.applied.ignore) if settled.applied else ""
    if attempt.ok:
        return row(modality, "verified", "", fix_used, len(attempt.traced.subgraphs))
    failure = attempt.failure
    if failure is not None:
        where = f" at {failure.location}" if failure.location else ""
        inside = f" in {failure.module_path} ({failure.module_class})"
        return row(modality, "not_traceable", f"{failure.kind}{where}{inside}")
    problems = attempt.check.verification.problems if attempt.check else []
    return row(modality, "mismatch", "; ".join(problems)[:300], fix_used)


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


def _full_size_error(
    cls: type[PreTrainedModel], config: PretrainedConfig, modality: str | None = None
) -> str | None:
    """transformers' own error when it cannot build the full-size default model or (given a
    ``modality``) run it eagerly: on ``meta``, reading values through phantoms, so no memory
    and no arithmetic at full size. Only asked after the twin failed: the answer says whose
    failure that was."""
    try:
        full = build_meta_model_of(cls, copy.deepcopy(config))
        if modality is None:
            return None
        sample = make_sample(full.config, modality, SAMPLE)
        with torch.no_grad(), MixedExecution():
            full(**sample, **concrete_arguments(full, {}))
    except Exception as err:  # noqa: BLE001 - any error is the verdict
        return _said(err)
    return None


def _said(err: BaseException) -> str:
    """The first line of an error, as transformers (or we) said it."""
    text = err.message if isinstance(err, LlmcTraceError) else str(err)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(err).__name__}: {first}"[:300]


def _one_thread() -> None:
    """Workers share the machine's cores: one torch thread each (tiny twins gain nothing from
    more, and idle threads spinning beside busy neighbours cost CPU time: a shard in-process
    with two threads took 258 CPU seconds, with one 30)."""
    torch.set_num_threads(1)


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


def cpu_seconds() -> float:
    """CPU seconds this process and its finished workers have used: on a shared machine the
    sweep's wall time says more about the neighbours than about the sweep."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime

