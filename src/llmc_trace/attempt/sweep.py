"""``coverage --all``: trace every generative model type of the installed transformers.

A user asks "does my architecture trace?" before downloading 100 GB, and every transformers
release may break an architecture no built-in covers. So each model type of transformers'
generative auto mappings (:func:`~llmc_trace.models.defaults.generative_types`) is built,
given a sample for every modality it takes, traced with the default sequential targets,
replayed against its own eager forward, and on a failure fixed as ``attempt --fix`` would
(:mod:`llmc_trace.attempt.sweep_type` says how, and what each row's outcome means).

Types run in worker processes (one torch thread each), so the sweep's time is the slowest
worker's share; the rows come back sorted, whatever order the workers finish in.
"""

from __future__ import annotations

import multiprocessing
import resource
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from llmc_trace.diagnose.swept import swept_seconds
from llmc_trace.attempt.sweep_type import SweepRow, sweep_type
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.models.defaults import generative_types

__all__ = ["SweepRow", "cpu_seconds", "sweep"]


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
        # the longest types first (as the shipped sweep timed them; a new type first of all):
        # none is left alone at the end while the other workers idle
        took = swept_seconds()
        first = sorted(chosen, key=lambda t: -took.get(t, float("inf")))
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_one_thread) as pool:
            futures = [pool.submit(sweep_type, t, known[t], fix=fix) for t in first]
            for done, future in enumerate(as_completed(futures)):
                rows.extend(future.result())
                report_progress(rows[-1].model_type, done + 1, len(chosen))
    report_progress("done", len(chosen), len(chosen))
    return sorted(rows, key=lambda row: (row.model_type, row.modality))


def _one_thread() -> None:
    """Workers share the machine's cores: one torch thread each (tiny twins gain nothing from
    more, and idle threads spinning beside busy neighbours cost CPU time: a shard in-process
    with two threads took 258 CPU seconds, with one 30)."""
    torch.set_num_threads(1)


def cpu_seconds() -> float:
    """CPU seconds this process and its finished workers have used: on a shared machine the
    sweep's wall time says more about the neighbours than about the sweep."""
    own, workers = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
