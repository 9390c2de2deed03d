"""Run ``attempt_trace`` over built-in models and modalities: the supported-architectures table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmc_trace.attempt.prove import attempt_trace
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import LlmcTraceError
from llmc_trace.models.samples import supported_modalities
from llmc_trace.models.source import builtin_names, resolve_model
from llmc_trace.tracing.settings import TracingSettings


@dataclass(frozen=True)
class CoverageRow:
    """One model and modality: traced without help, after fixes, or not at all.

    ``seconds`` is the whole attempt (fix search and verification included); ``trace_s`` the
    trace of the model that settled it (with the fix, when one was applied), as
    ``attempt --json`` reports it.

    ``pairs`` counts the smooth -> balance pairs AWQ and SmoothQuant would scale, found in the
    graph and proved on the twin (``plan --mappings`` lists them), for a text row that traced
    (``None`` otherwise); ``pairs_skipped`` those left out, ``pairs_note`` why (one line per
    kind of pair, or why none were counted), ``pairs_fix`` the ``tracing_ignore`` entries the
    trace into the layers needed beyond the row's own, ``pairs_s`` what counting them took.
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
    pairs: int | None = None
    pairs_skipped: int = 0
    pairs_note: str = ""
    pairs_fix: list[str] = field(default_factory=list)
    pairs_s: float = 0.0


def coverage_rows(
    names: list[str] | None = None,
    modalities: list[str] | None = None,
    fix: bool = True,
    progress: Progress | None = None,
    pairs: bool = False,
    tracing: TracingSettings | None = None,
) -> list[CoverageRow]:
    """Attempt every (model, modality); with ``fix``, failures are retried with the fix search;
    with ``pairs``, each text row that traced counts its smooth -> balance pairs (a trace into
    every linear layer of the full model and one of the twin, then the folds: it about triples
    the run, so it is asked for). ``tracing`` is applied to every model covered, as ``attempt``
    applies it to one: a model it names nothing of (a target or ``tracing_ignore`` entry that
    matches none of its modules) gets a row that did not trace, with that error as its problem."""
    settings = tracing or TracingSettings()
    report_progress = progress or no_progress
    jobs = []
    rows = []
    for name in names or builtin_names():
        source = resolve_model(name)
        try:
            config = source.config()
        except LlmcTraceError as err:  # a config this transformers cannot read: its own row
            model_type = str(source.config_dict.get("model_type", "-"))
            rows.append(
                CoverageRow(name, model_type, "-", False, False, 0, "", 0.0, 0.0, err.message)
            )
            continue
        for modality in supported_modalities(config):
            if modalities is None or modality in modalities:
                jobs.append((name, config.model_type, modality))
    for index, (name, model_type, modality) in enumerate(jobs):
        report_progress(f"{name} · {modality}", index, len(jobs))
        start = time.perf_counter()
        try:
            report = attempt_trace(name, tracing=settings, modality=modality, fix=fix)
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
        fixes = list(report.applied_fix.tracing_ignore) if report.applied_fix else []
        elapsed = time.perf_counter() - start
        counted = (
            _pair_counts(name, [*settings.tracing_ignore, *fixes])
            if pairs and report.traced and modality == "text"
            else {}
        )
        rows.append(
            CoverageRow(
                name,
                model_type,
                modality,
                report.traced,
                report.ok,
                len(report.subgraphs),
                ", ".join(fixes),
                elapsed,
                report.timings_s.get("trace_s", 0.0),
                problem,
                **counted,
            )
        )
    report_progress("done", len(jobs), len(jobs))
    return rows


def _pair_counts(name: str, tracing_ignore: list[str]) -> dict[str, object]:
    """The ``pairs*`` fields of a text row that traced (with the list it was given and the fix
    it needed)."""
    from llmc_trace.traced.mappings import source_mappings

    start = time.perf_counter()
    entries = tuple(dict.fromkeys(tracing_ignore))
    try:
        found = source_mappings(name, tracing=TracingSettings(tracing_ignore=entries))
    except Exception as err:  # the trace into every layer can stop where the layers' did not
        message = err.message if isinstance(err, LlmcTraceError) else f"{type(err).__name__}: {err}"
        note = f"not counted: {message[:200]}"
        return {"pairs_note": note, "pairs_s": time.perf_counter() - start}
    return {
        "pairs": len(found.mappings),
        "pairs_skipped": len(found.skipped),
        "pairs_note": "; ".join(found.skipped_lines()),
        "pairs_fix": list(found.fix),
        "pairs_s": time.perf_counter() - start,
    }


def pairs_text(row: CoverageRow) -> str:
    """A row's pairs as a table cell: ``84 (+2 skipped)``, empty where none were counted."""
    if row.pairs is None:
        return ""
    return f"{row.pairs} (+{row.pairs_skipped} skipped)" if row.pairs_skipped else str(row.pairs)


def coverage_markdown(rows: list[CoverageRow]) -> str:
    """The README's supported-architectures table (``coverage --markdown``): one row per pair,
    the reason where it did not verify."""
    lines = [
        "| model | architecture | modality | traced | verified | subgraphs | fix used "
        "| trace s | seconds | smoothing pairs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fix = f"`{r.fix}`" if r.fix else ""
        verdict = "yes" if r.verified else f"no: {r.problem}" if r.problem else "no"
        lines.append(
            f"| {r.model} | {r.model_type} | {r.modality} | {'yes' if r.traced else 'no'} "
            f"| {verdict} | {r.subgraphs} | {fix} | {r.trace_s:.2f} | {r.seconds:.1f} "
            f"| {pairs_text(r)} |"
        )
    return "\n".join(lines)
