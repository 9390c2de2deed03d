"""``render``: draw a model's trace as SVG or self-contained HTML, written atomically.

The same inputs give byte-identical files: views iterate in graph and module order, ids come
from node names, and nothing records a time, a host or an absolute path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmc_trace.core.names import VIEWS
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.errors import BadInputError, NotTraceableError, OutputError
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.source import ModelSource
from llmc_trace.render.detail import draw_detail
from llmc_trace.render.drawing import Drawing
from llmc_trace.render.failure import draw_failure
from llmc_trace.render.modules import draw_modules
from llmc_trace.render.overview import draw_overview
from llmc_trace.render.page import render_html
from llmc_trace.render.svg import render_svg
from llmc_trace.traced.model import TracedModel, trace_source

FORMATS = (".svg", ".html")


@dataclass(frozen=True)
class RenderResult:
    """What was written: the file, its view, and how many graph nodes it draws."""

    path: Path
    view: str
    num_nodes: int
    traced: bool


def check_request(out: str | Path, view: str, subgraphs: Sequence[int] | None) -> Path:
    """Validate the cheap inputs before any tracing; returns ``out`` as a path."""
    if view not in VIEWS:
        raise BadInputError(
            f"Unknown view {view!r}.", hint=f"Use one of {', '.join(VIEWS)}.", param="view"
        )
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise BadInputError(
            f"Cannot tell the format of {path.name!r} from its extension.",
            hint="Name the output file *.svg (the picture) or *.html (interactive page).",
            param="out",
        )
    if subgraphs is not None and view != "detail":
        raise BadInputError(
            f"Choosing subgraphs applies to the detail view, not to {view!r}.",
            hint="Add --view detail, or leave out --subgraphs.",
            param="subgraphs",
        )
    return path


def draw(
    trace: TracedModel, view: str, subgraphs: Sequence[int] | None = None, collapse: bool = False
) -> Drawing:
    """The :class:`Drawing` of one view of ``trace`` (no Graphviz, no files)."""
    if view == "failure":
        if trace.failure is None:
            raise BadInputError(
                f"{trace.name} traced without failure, so there is no failure to draw.",
                hint="Use --view overview, detail or modules.",
                param="view",
            )
        return draw_failure(trace)
    if view == "modules":  # useful for a failed trace too: it shows what to ignore
        return draw_modules(trace, collapse)
    if trace.failure is not None:
        where = f" at {trace.failure.location}" if trace.failure.location else ""
        raise NotTraceableError(
            f"{trace.name} is not traceable: {trace.failure.explanation}{where}; there is "
            f"no {view} to draw.",
            hint="Render --view failure to see where tracing stopped, or --view modules to "
            "choose modules to ignore.",
        )
    if view == "overview":
        return draw_overview(trace, collapse)
    return draw_detail(trace, subgraphs, collapse)


def render_trace(
    trace: TracedModel,
    out: str | Path,
    *,
    view: str = "overview",
    subgraphs: Sequence[int] | None = None,
    collapse: bool = False,
) -> RenderResult:
    """Draw ``trace`` in ``view`` and write ``out`` (``.svg`` or ``.html``) atomically."""
    path = check_request(out, view, subgraphs)
    drawing = draw(trace, view, subgraphs, collapse)
    svg = render_svg(drawing)
    text = render_html(drawing, svg) if path.suffix.lower() == ".html" else svg
    write_atomically(path, text)
    return RenderResult(path, view, len(drawing.nodes), trace.failure is None)


def render(
    model: str | ModelSource,
    out: str | Path,
    *,
    view: str = "overview",
    subgraphs: Sequence[int] | None = None,
    collapse: bool = False,
    modality: str = "text",
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int = 1,
    seq_len: int = 32,
    image_size: int | None = None,
    progress: Progress | None = None,
) -> RenderResult:
    """Trace ``model`` (built-in, hub id or folder) and draw one view of it into ``out``.

    Views: ``overview`` (subgraphs and the values between them), ``detail`` (the operations
    of ``subgraphs``, default all), ``modules`` (the module tree by tracing role) and
    ``failure`` (the graph up to the failure). ``collapse`` merges runs of identical
    subgraphs (or sibling modules). Bad input raises
    :class:`~llmc_trace.errors.BadInputError` before tracing; an untraceable model raises
    :class:`~llmc_trace.errors.NotTraceableError` except for the failure and modules
    views.

    >>> result = render("meta-llama/Llama-2-7b-hf", "llama.html", collapse=True)  # doctest: +SKIP
    >>> result.num_nodes                                                         # doctest: +SKIP
    5
    """
    report = progress or no_progress
    check_request(out, view, subgraphs)
    report("trace", 0, 2)
    trace = trace_source(
        model,
        modality=modality,
        sequential_targets=sequential_targets,
        ignore=ignore,
        targets_per_subgraph=targets_per_subgraph,
        sample_options=SampleOptions(seq_len=seq_len, image_size=image_size),
    )
    report("draw", 1, 2)
    result = render_trace(trace, out, view=view, subgraphs=subgraphs, collapse=collapse)
    report("done", 2, 2)
    return result


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder.

    Readers see either the old file or the complete new one, never a half-written file,
    even if the process dies mid-write.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
        )
    except OSError as err:
        raise OutputError.writing(path, err) from err
    # mkstemp makes the file private (0600); a picture is meant to be shared
    os.fchmod(handle, path.stat().st_mode & 0o777 if path.exists() else 0o644)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException as err:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OutputError.writing(path, err) from err
        raise
