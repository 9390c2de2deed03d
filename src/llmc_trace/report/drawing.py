"""Draw a compression report's overview: the subgraphs in order, coloured by relative loss.

Each box is one subgraph (the pipeline's unit), holding one coloured cell per compressed layer
and titled in the colour of its worst layer, so a glance down the chain finds where the
method struggled. The same report gives the same drawing, and Graphviz the same SVG bytes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from llmc_trace.render.drawing import Drawing, NodeInfo, caption_label, new_digraph
from llmc_trace.render.labels import html_text, plural, safe_id
from llmc_trace.render.svg import render_svg
from llmc_trace.report.schema import CompressionReport, LayerRow, StageSettings

#: Colours along the scale of `loss_scale`: green, yellow, red.
RAMP = ((0.0, (0xC8, 0xE6, 0xC9)), (0.5, (0xFF, 0xF5, 0x9D)), (1.0, (0xEF, 0x9A, 0x9A)))
NO_VALUE = "#eeeeee"
DECADES = 2
"""Relative losses from 10^-DECADES (the method removed 99 % of the baseline's error) to 1
(none of it) span the colour scale; outside they take its ends."""
CELLS_PER_ROW = 8
"""Layer cells per row of a box: a layer of 64 experts wraps instead of widening the chain."""


def loss_scale(relative_loss: float) -> float:
    """A relative loss placed in [0, 1] on a log scale: 0.01 -> 0, 0.1 -> 0.5, 1 -> 1.

    Logarithmic because a ratio's meaning is multiplicative: 0.05 against 0.1 is the same
    gain as 0.5 against 1, and one run's layers spread over a decade or more."""
    if relative_loss <= 0:
        return 0.0
    return min(max(math.log10(relative_loss) / DECADES + 1, 0.0), 1.0)


def loss_colour(relative_loss: float | None) -> str:
    """The fill for a relative loss: green at 0.01 or below, yellow at 0.1, red at 1 and above."""
    if relative_loss is None:
        return NO_VALUE
    value = loss_scale(relative_loss)
    for (low, start), (high, end) in zip(RAMP, RAMP[1:]):
        if value <= high:
            t = (value - low) / (high - low)
            channels = (round(a + (b - a) * t) for a, b in zip(start, end))
            return "#" + "".join(f"{c:02x}" for c in channels)
    raise AssertionError("unreachable: the ramp ends at 1")


@dataclass(frozen=True)
class _Box:
    """One box of the overview: a subgraph (or, untraced, a block of layers) and its rows."""

    node_id: str
    title: str
    rows: list[LayerRow]


def describe_stage(stage: StageSettings) -> str:
    """``gptq W4A16 (3-bit, group 128, actorder static)``, ``sparsegpt 2:4``."""
    parts = [stage.method]
    if stage.sparsity is not None:
        parts.append(stage.sparsity)
    if stage.scheme is not None:
        weights = stage.weights or {}
        grid = [f"{weights.get('num_bits')}-bit"]
        if weights.get("strategy") == "group":
            grid.append(f"group {weights.get('group_size')}")
        elif weights.get("strategy"):
            grid.append(f"per {weights['strategy']}")
        if weights.get("actorder"):
            grid.append(f"actorder {weights['actorder']}")
        parts.append(f"{stage.scheme} ({', '.join(grid)})")
    return " ".join(parts)


def draw_report(report: CompressionReport) -> Drawing:
    """The overview coloured by the last stage's relative losses (the checkpoint's)."""
    last = len(report.settings.stages) - 1
    rows = [row for row in report.layers if row.stage == last]
    boxes = _boxes(report, rows)
    settings = report.settings
    stage = settings.stages[last]
    baseline = next((row.baseline for row in rows if row.baseline), "the baseline")
    caption = [
        f"{report.model} · {describe_stage(stage)}",
        f"{settings.samples} samples of {settings.seq_len} tokens · {stage.pipeline} pipeline",
        f"A cell is a layer: its loss / {baseline}'s on the same Hessian.",
        "A box's title has its worst layer's colour.",
    ]
    legend = [(loss_colour(v), f"{v:g}") for v in (0.01, 0.03, 0.1, 0.3)]
    legend += [(loss_colour(1), "≥ 1"), (NO_VALUE, "none")]
    dot = new_digraph("report", caption_label(caption, legend))
    nodes: dict[str, NodeInfo] = {}
    for box in boxes:
        dot.node(box.node_id, _box_label(box), id=box.node_id, shape="plain", style="solid")
        nodes[box.node_id] = NodeInfo(box.title, tuple(_box_fields(box)))
    for tail, head in zip(boxes, boxes[1:]):
        dot.edge(tail.node_id, head.node_id)
    return Drawing(
        view="report",
        title=f"{report.model} · compression report",
        caption="\n".join(caption),
        dot=dot.source,
        nodes=nodes,
        subgraphs={},
    )


def box_id(row: LayerRow) -> str:
    """The SVG id of the box that holds ``row``'s cell."""
    if row.subgraph is not None:
        return safe_id("sg-", str(row.subgraph))
    return safe_id("block-", block_of(row.name))


def _boxes(report: CompressionReport, rows: list[LayerRow]) -> list[_Box]:
    """Every subgraph in order with the rows it runs; rows of no subgraph (an untraced model)
    grouped by their block (the path up to its layer number)."""
    boxes = []
    for subgraph in report.subgraphs:
        targets = ", ".join(subgraph.targets) or "no sequential target"
        inside = [row for row in rows if row.subgraph == subgraph.index]
        boxes.append(
            _Box(safe_id("sg-", str(subgraph.index)), f"#{subgraph.index} · {targets}", inside)
        )
    blocks: dict[str, list[LayerRow]] = {}
    for row in rows:
        if row.subgraph is None:
            blocks.setdefault(block_of(row.name), []).append(row)
    boxes += [_Box(safe_id("block-", name), name, inside) for name, inside in blocks.items()]
    return boxes


def block_of(name: str) -> str:
    """``model.layers.3`` for ``model.layers.3.mlp.down_proj``: the path up to its first
    number, or the layer's parent when it has none."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def _short(name: str) -> str:
    """``q_proj``; ``17.gate_proj`` for an expert, whose number tells it from its siblings."""
    parts = name.split(".")
    if len(parts) > 2 and parts[-2].isdigit():
        return ".".join(parts[-2:])
    return parts[-1]


def _worst(rows: list[LayerRow]) -> LayerRow | None:
    compared = [row for row in rows if row.relative_loss is not None]
    return max(compared, key=lambda row: row.relative_loss or 0.0) if compared else None


def _box_label(box: _Box) -> str:
    worst = _worst(box.rows)
    width = max(min(len(box.rows), CELLS_PER_ROW), 1)
    if not box.rows:
        note = "no compressed layers"
    elif worst is None:
        note = plural(len(box.rows), "layer")
    else:
        median = statistics.median(r.relative_loss for r in box.rows if r.relative_loss is not None)
        note = f"worst {_short(worst.name)} {worst.relative_loss:.3f} · median {median:.3f}"
    title_colour = loss_colour(worst.relative_loss) if worst else "#ffffff"
    cells = [
        f'<TD BGCOLOR="{loss_colour(row.relative_loss)}" '
        f'TOOLTIP="{html_text(_tooltip(row))}" HREF="#{html_text(row_id(row))}">'
        f"{html_text(_short(row.name))}<BR/>"
        f'<FONT POINT-SIZE="9">{row.method if row.fallback else ratio_text(row.relative_loss)}'
        "</FONT></TD>"
        for row in box.rows
    ]
    lines = ["".join(cells[i : i + CELLS_PER_ROW]) for i in range(0, len(cells), CELLS_PER_ROW)]
    rows = "".join(f"<TR>{line}</TR>" for line in lines)
    return (
        '<<TABLE BORDER="1" CELLBORDER="1" CELLSPACING="0" CELLPADDING="4" COLOR="#9e9e9e">'
        f'<TR><TD COLSPAN="{width}" BGCOLOR="{title_colour}" ALIGN="LEFT" BALIGN="LEFT">'
        f'<B>{html_text(box.title)}</B><BR/><FONT POINT-SIZE="9">{html_text(note)}</FONT></TD></TR>'
        f"{rows}</TABLE>>"
    )


def _box_fields(box: _Box) -> list[tuple[str, str]]:
    return [(row.name, ratio_text(row.relative_loss)) for row in box.rows]


def _tooltip(row: LayerRow) -> str:
    if row.fallback:
        return f"{row.name}: {row.fallback}"
    return f"{row.name}: relative loss {ratio_text(row.relative_loss)}"


def ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def number_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def row_id(row: LayerRow) -> str:
    return safe_id(f"layer-{row.stage}-", row.name)


def render_report_svg(report: CompressionReport) -> str:
    """The coloured overview alone, as a standalone SVG (needs Graphviz's ``dot``)."""
    return render_svg(draw_report(report))
