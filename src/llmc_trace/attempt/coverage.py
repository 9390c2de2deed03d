"""Run ``attempt_trace`` over built-in models and modalities: the supported-architectures table."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llmc_trace.attempt.prove import attempt_trace
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import LlmcTraceError
from llmc_trace.models.samples import supported_modalities
from llmc_trace.models.source import builtin_names, resolve_model


@dataclass(frozen=True)
class CoverageRow:
    """One model and modality: traced without help, after fixes, or not at all.

    ``seconds`` is the whole attempt (fix search and verification included); ``trace_s`` the
    trace of the model that settled it (with the fix, when one was applied), as
    ``attempt --json`` reports it.
    """

    model: str
    model_type: str
    modality: str
    traced: bool
    verified: bool
    subgraphs: int
    fix: str
    seconds: float
    trace_s: float
    problem: str


def coverage_rows(
    names: list[str] | None = None,
    modalities: list[str] | None = None,
    fix: bool = True,
    progress: Progress | None = None,
) -> list[CoverageRow]:
    """Attempt every (model, modality); with ``fix``, failures are retried with the fix search."""
    report_progress = progress or no_progress
    jobs = []
    for name in names or builtin_names():
        config = resolve_model(name).config()
        for modality in supported_modalities(config):
            if modalities is None or modality in modalities:
                jobs.append((name, config.model_type, modality))
    rows = []
    for index, (name, model_type, modality) in enumerate(jobs):
        report_progress(f"{name} · {modality}", index, len(jobs))
        start = time.perf_counter()
        try:
            report = attempt_trace(name, modality=modality, fix=fix)
        except Exception as err:  # one architecture's crash must not hide the others' results
            message = (
                err.message
                if isinstance(err, LlmcTraceError)
                else (f"{type(err).__name__}: {str(err)[:160]}")
            )
            elapsed = time.perf_counter() - start
            rows.append(
                CoverageRow(name, model_type, modality, False, False, 0, "", elapsed, 0.0, message)
            )
            continue
        problem = ""
        if report.failure is not None:
            where = report.failure.location
            problem = (
                f"{report.failure.kind} at {where.file}:{where.line}"
                if where
                else report.failure.kind
            )
        elif report.verification is not None and not report.verification.ok:
            problem = "; ".join(report.verification.problems)[:200]
        elif report.structure is not None and not report.structure.matches:
            problem = "; ".join(report.structure.differences)[:200]
        rows.append(
            CoverageRow(
                name,
                model_type,
                modality,
                report.traced,
                report.ok,
                len(report.subgraphs),
                ", ".join(report.applied_fix.tracing_ignore) if report.applied_fix else "",
                time.perf_counter() - start,
                report.timings_s.get("trace_s", 0.0),
                problem,
            )
        )
    report_progress("done", len(jobs), len(jobs))
    return rows


def coverage_markdown(rows: list[CoverageRow]) -> str:
    """The README's supported-architectures table (``coverage --markdown``): one row per pair,
    the reason where it did not verify."""
    lines = [
        "| model | architecture | modality | traced | verified | subgraphs | fix used "
        "| trace s | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fix = f"`{r.fix}`" if r.fix else ""
        verdict = "yes" if r.verified else f"no: {r.problem}" if r.problem else "no"
        lines.append(
            f"| {r.model} | {r.model_type} | {r.modality} | {'yes' if r.traced else 'no'} "
            f"| {verdict} | {r.subgraphs} | {fix} | {r.trace_s:.2f} | {r.seconds:.1f} |"
        )
    return "\n".join(lines)
