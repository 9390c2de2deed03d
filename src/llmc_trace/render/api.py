"""``render``: draw a model's trace as SVG or self-contained HTML, written atomically.

The HTML of the overview is the page that unfolds in place (:mod:`~llmc_trace.render.unfold`);
:func:`render_page` returns it as text, for notebooks and other pages. The same inputs give
byte-identical files: views iterate in graph and module order, ids come from node names, and
nothing records a time, a host or an absolute path.
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
from llmc_trace.render.overlay import Overlay
from llmc_trace.render.page import iframe, render_html, render_unfolding_html
from llmc_trace.render.source import source_page
from llmc_trace.render.svg import inline_svg, render_svg
from llmc_trace.render.unfold import unfolding_page
from llmc_trace.traced.model import TracedModel, trace_source
from llmc_trace.tracing.settings import TracingSettings, tracing_settings

FORMATS = (".svg", ".html")


@dataclass(frozen=True)
class RenderResult:
    """What was written: the file, its view, and how many graph nodes it draws (a page: as
    it opens). In a notebook it shows the file itself, page or picture."""

    path: Path
    view: str
    num_nodes: int
    traced: bool

    def _repr_html_(self) -> str:
        text = self.path.read_text(encoding="utf-8")
        return iframe(text if self.path.suffix.lower() == ".html" else inline_svg(text))


def check_request(
    out: str | Path, view: str, subgraphs: Sequence[int] | None, overlay: Overlay | None = None
) -> Path:
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
    if view == "source" and path.suffix.lower() != ".html":
        raise BadInputError(
            f"The source view is a page of model code, not a picture: {path.name!r} is not *.html.",
            hint="Name the output file *.html.",
            param="out",
        )
    if overlay is not None and (view != "overview" or path.suffix.lower() != ".html"):
        raise BadInputError(
            f"An overlay colours the overview's HTML page, not the {view} view's "
            f"{path.suffix} file.",
            hint="Write the overview to *.html, or leave out the overlay.",
            param="overlay",
        )
    return path


def draw(
    trace: TracedModel, view: str, subgraphs: Sequence[int] | None = None, expand: bool = False
) -> Drawing:
    """The :class:`Drawing` of one view of ``trace`` (no Graphviz, no files).

    On a deep model the views draw each run of identical layers (or numbered sibling modules)
    once; ``expand`` draws every member.
    """
    if view == "failure":
        if trace.failure is None:
            raise BadInputError(
                f"{trace.name} traced without failure, so there is no failure to draw.",
                hint="Use --view overview, detail or modules.",
                param="view",
            )
        return draw_failure(trace)
    if view == "modules":  # useful for a failed trace too: it shows what to ignore
        return draw_modules(trace, expand)
    if trace.failure is not None:
        where = f" at {trace.failure.location}" if trace.failure.location else ""
        raise NotTraceableError(
            f"{trace.name} is not traceable: {trace.failure.explanation}{where}; there is "
            f"no {view} to draw.",
            hint="Render --view failure to see where tracing stopped, or --view modules to "
            "choose modules to ignore.",
        )
    if view == "overview":
        return draw_overview(trace, expand)
    return draw_detail(trace, subgraphs, expand)


def render_trace(
    trace: TracedModel,
    out: str | Path,
    *,
    view: str = "overview",
    subgraphs: Sequence[int] | None = None,
    expand: bool = False,
    overlay: Overlay | None = None,
) -> RenderResult:
    """Draw ``trace`` in ``view`` and write ``out`` (``.svg`` or ``.html``) atomically.

    The overview's ``.html`` is the page that unfolds (see :func:`render_page`, which
    ``overlay`` colours); the other views' pages show their picture.
    """
    path = check_request(out, view, subgraphs, overlay)
    if view == "source":
        write_atomically(path, source_page(trace))
        graph = trace.trace.graph if trace.trace is not None else trace.partial_graph
        return RenderResult(path, view, len(graph.nodes) if graph else 0, trace.failure is None)
    page = path.suffix.lower() == ".html" and view == "overview"
    drawing = draw(trace, view, subgraphs, expand)
    if page:
        text = render_page(trace, expand=expand, overlay=overlay)
    elif path.suffix.lower() == ".html":
        text = render_html(drawing)
    else:
        text = render_svg(drawing)
    write_atomically(path, text)
    return RenderResult(path, view, len(drawing.nodes), trace.failure is None)


def render_page(trace: TracedModel, *, expand: bool = False, overlay: Overlay | None = None) -> str:
    """The self-contained HTML page of ``trace``: the overview, unfolding in place.

    It opens on the overview with runs of identical layers folded (``expand``: unfolded);
    a click unfolds a run into its layers, a subgraph into its operations, a module call
    into the module's children; search finds nodes inside folded parts and unfolds them.
    ``overlay`` colours every box by a value per module path, with a legend and tooltips.
    An untraceable model gives the failure view's page instead: the picture that explains it.
    Embed the page elsewhere with :func:`~llmc_trace.render.page.iframe`.

    >>> trace = trace_source("meta-llama/Llama-3.1-70B")                      # doctest: +SKIP
    >>> loss = {f"model.layers.{i}": i / 79 for i in range(80)}               # doctest: +SKIP
    >>> page = render_page(trace, overlay=Overlay("relative loss", loss))     # doctest: +SKIP
    """
    if trace.partitioned is None:
        return render_html(draw_failure(trace))
    if overlay is not None:
        overlay.check_paths(path for path, _ in trace.model.named_modules())
    return render_unfolding_html(unfolding_page(trace, expand), overlay, trace.decisions)


def render(
    model: str | ModelSource,
    out: str | Path,
    *,
    view: str = "overview",
    subgraphs: Sequence[int] | None = None,
    expand: bool = False,
    overlay: Overlay | None = None,
    tracing: TracingSettings | None = None,
    modality: str = "text",
    seq_len: int = 32,
    image_size: int | None = None,
    progress: Progress | None = None,
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int | None = None,
) -> RenderResult:
    """Trace ``model`` (built-in, hub id or folder) as ``tracing`` says and draw one view of
    it into ``out``. ``sequential_targets``, ``ignore`` and ``targets_per_subgraph`` are
    deprecated spellings of ``tracing``'s fields.

    Views: ``overview`` (subgraphs and the values between them), ``detail`` (the operations
    of ``subgraphs``, default all), ``modules`` (the module tree by tracing role),
    ``failure`` (the graph up to the failure) and ``source`` (the model code the trace ran,
    its decisions and nodes: :mod:`~llmc_trace.render.source`, a page only). On a deep model the views draw each run of
    identical layers (or numbered sibling modules) once; ``expand`` draws every member. The
    overview's ``.html`` is the page that unfolds in place (:func:`render_page`), coloured by
    ``overlay``. Bad input raises :class:`~llmc_trace.errors.BadInputError` before tracing;
    an untraceable model raises :class:`~llmc_trace.errors.NotTraceableError` except for the
    failure and modules views.

    >>> result = render("meta-llama/Llama-3.1-70B", "llama.html")  # doctest: +SKIP
    >>> result.num_nodes                                            # doctest: +SKIP
    6
    """
    settings = tracing_settings(
        tracing,
        "render",
        {
            "sequential_targets": sequential_targets,
            "ignore": ignore,
            "targets_per_subgraph": targets_per_subgraph,
        },
    )
    report = progress or no_progress
    check_request(out, view, subgraphs, overlay)
    report("trace", 0, 2)
    trace = trace_source(
        model,
        tracing=settings,
        modality=modality,
        sample_options=SampleOptions(seq_len=seq_len, image_size=image_size),
        # the source view shows them, the overview's page lists them; a picture has no place
        record_decisions=view == "source"
        or (view == "overview" and Path(out).suffix.lower() == ".html"),
    )
    report("draw", 1, 2)
    result = render_trace(
        trace, out, view=view, subgraphs=subgraphs, expand=expand, overlay=overlay
    )
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
