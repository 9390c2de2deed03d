"""Draw a compression report's overview: the subgraphs in order, coloured by relative loss.

Each box is one subgraph (the pipeline's unit), holding one coloured cell per compressed layer
and titled in the colour of its worst layer, so a glance down the chain finds where the
method struggled. A chain needs no layout engine: the boxes are placed here, top to bottom,
so every ``compress`` writes its page without Graphviz (nor the trace viewer) and the same
report gives the same SVG bytes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from llmc_trace.core.markup import html_text, plural, safe_id
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
    """``gptq W4A16 (3-bit, group 128, actorder static)``, ``gptq FP8_BLOCK (8-bit float,
    block 128x128, actorder static)``, ``sparsegpt 2:4``."""
    parts = [stage.method]
    if stage.sparsity is not None:
        parts.append(stage.sparsity)
    if stage.scheme is not None:
        weights = stage.weights or {}
        kind = " float" if weights.get("type") == "float" else ""
        grid = [f"{weights.get('num_bits')}-bit{kind}"]
        if weights.get("strategy") in ("group", "tensor_group"):
            grid.append(f"group {weights.get('group_size')}")
        elif weights.get("strategy") == "block":
            grid.append("block {}x{}".format(*weights.get("block_structure") or ("?", "?")))
        elif weights.get("strategy"):
            grid.append(f"per {weights['strategy']}")
        if weights.get("actorder"):
            grid.append(f"actorder {weights['actorder']}")
        parts.append(f"{stage.scheme} ({', '.join(grid)})")
    return " ".join(parts)


#: The overview's geometry, in SVG pixels. Text is sized by its characters (no font metrics
#: are read, so the same report gives the same bytes on every machine).
CELL_WIDTH, CELL_HEIGHT, TITLE_HEIGHT = 92, 34, 36
GAP = 26  # between boxes, where the arrow runs
MARGIN = 8
LINE = 16  # caption line height
CHAR = 7.2  # width of one character at 12 px


@dataclass(frozen=True)
class Overview:
    """The drawn overview: the ``<svg>`` element and each box's id with its title."""

    svg: str
    boxes: dict[str, str]


def draw_report(report: CompressionReport) -> Overview:
    """The overview coloured by the last stage's relative losses (the checkpoint's): a chain
    of boxes, top to bottom, laid out here (no Graphviz)."""
    last = len(report.settings.stages) - 1
    rows = [row for row in report.layers if row.stage == last]
    boxes = _boxes(report, rows)
    settings = report.settings
    stage = settings.stages[last]
    baseline = next((row.baseline for row in rows if row.baseline), "the baseline")
    caption = [
        f"{report.model} · {describe_stage(stage)}",
        f"{settings.calibrated_on()} · {stage.pipeline} pipeline",
        f"A cell is a layer: its loss / {baseline}'s on the same Hessian.",
        "A box's title has its worst layer's colour.",
    ]
    legend = [(loss_colour(v), f"{v:g}") for v in (0.01, 0.03, 0.1, 0.3)]
    legend += [(loss_colour(1), "≥ 1"), (NO_VALUE, "none")]
    widths = [_box_width(box) for box in boxes]
    caption_width = max(len(line) for line in caption) * CHAR
    width = MARGIN * 2 + max([caption_width, len(legend) * 60.0, *widths])
    parts = [
        f'<text x="{MARGIN}" y="{MARGIN + LINE * (i + 1) - 4}" class="caption">{html_text(line)}'
        "</text>"
        for i, line in enumerate(caption)
    ]
    y = MARGIN + LINE * len(caption) + 4
    for i, (colour, label) in enumerate(legend):
        x = MARGIN + i * 60
        parts.append(
            f'<rect x="{x}" y="{y}" width="16" height="12" fill="{colour}" stroke="#9e9e9e"/>'
            f'<text x="{x + 20}" y="{y + 10}">{html_text(label)}</text>'
        )
    y += 12 + GAP
    centre = width / 2
    for index, (box, box_width) in enumerate(zip(boxes, widths)):
        if index:  # the arrow from the box above
            parts.append(
                f'<g class="edge"><line x1="{centre:g}" y1="{y - GAP:g}" x2="{centre:g}" '
                f'y2="{y - 6:g}" stroke="#616161"/><polygon points="{centre - 4:g},{y - 7:g} '
                f'{centre + 4:g},{y - 7:g} {centre:g},{y:g}" fill="#616161"/></g>'
            )
        height = _box_height(box)
        parts.append(_box_svg(box, centre - box_width / 2, y, box_width))
        y += height + GAP
    height = y - GAP + MARGIN
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="Helvetica, Arial, sans-serif" '
        f'font-size="12">\n<title>{html_text(report.model)} · compression report</title>\n'
        + "\n".join(parts)
        + "\n</svg>\n"
    )
    return Overview(svg, {box.node_id: box.title for box in boxes})


def _box_width(box: _Box) -> float:
    """Wide enough for its cells (up to `CELLS_PER_ROW` a row) and its two title lines."""
    cells = max(min(len(box.rows), CELLS_PER_ROW), 1) * CELL_WIDTH
    return max(cells, (max(len(box.title), len(_note(box))) + 2) * CHAR)


def _box_height(box: _Box) -> int:
    return TITLE_HEIGHT + -(-len(box.rows) // CELLS_PER_ROW) * CELL_HEIGHT


def _note(box: _Box) -> str:
    worst = _worst(box.rows)
    if not box.rows:
        return "no compressed layers"
    if worst is None:
        return plural(len(box.rows), "layer")
    median = statistics.median(r.relative_loss for r in box.rows if r.relative_loss is not None)
    return f"worst {_short(worst.name)} {worst.relative_loss:.3f} · median {median:.3f}"


def _box_svg(box: _Box, x: float, y: float, width: float) -> str:
    """One box: an outline (the polygon the page highlights), its title cell in its worst
    layer's colour, and a cell per layer linking to the layer's row of the table."""
    worst = _worst(box.rows)
    title_colour = loss_colour(worst.relative_loss) if worst else "#ffffff"
    height = _box_height(box)
    right, bottom = x + width, y + height
    parts = [
        f'<g class="node" id="{box.node_id}"><title>{html_text(box.title)}</title>',
        f'<rect x="{x:g}" y="{y:g}" width="{width:g}" height="{TITLE_HEIGHT}" '
        f'fill="{title_colour}"/>',
        f'<text x="{x + 6:g}" y="{y + 15:g}" font-weight="bold">{html_text(box.title)}</text>',
        f'<text x="{x + 6:g}" y="{y + 30:g}" font-size="9">{html_text(_note(box))}</text>',
    ]
    for i, row in enumerate(box.rows):
        cx = x + (i % CELLS_PER_ROW) * CELL_WIDTH
        cy = y + TITLE_HEIGHT + (i // CELLS_PER_ROW) * CELL_HEIGHT
        value = row.method if row.fallback else ratio_text(row.relative_loss)
        parts.append(
            f'<a href="#{html_text(row_id(row))}"><title>{html_text(_tooltip(row))}</title>'
            f'<rect x="{cx:g}" y="{cy:g}" width="{CELL_WIDTH}" height="{CELL_HEIGHT}" '
            f'fill="{loss_colour(row.relative_loss)}" stroke="#9e9e9e"/>'
            f'<text x="{cx + CELL_WIDTH / 2:g}" y="{cy + 14:g}" text-anchor="middle">'
            f"{html_text(_short(row.name))}</text>"
            f'<text x="{cx + CELL_WIDTH / 2:g}" y="{cy + 27:g}" text-anchor="middle" '
            f'font-size="9">{html_text(value)}</text></a>'
        )
    parts.append(
        f'<polygon points="{x:g},{y:g} {right:g},{y:g} {right:g},{bottom:g} {x:g},{bottom:g}" '
        'fill="none" stroke="#9e9e9e"/></g>'
    )
    return "".join(parts)


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
    """The coloured overview alone, as a standalone SVG document."""
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + draw_report(report).svg
