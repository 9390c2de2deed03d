"""Helpers of the render tests: config builders, untraceable traces, and SVG readers."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import torch
from transformers import LlamaConfig

from llmc_trace.traced.model import TracedModel, trace_model
from llmc_trace.tracing.options import TracingOptions
from tests.patterns import untraceable as patterns

SVG = "{http://www.w3.org/2000/svg}"


def llama_config(layers: int, hidden: int = 64) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128 if hidden == 64 else 128256,
        hidden_size=hidden,
        intermediate_size=2 * hidden if hidden == 64 else 28672,
        num_hidden_layers=layers,
        num_attention_heads=4 if hidden == 64 else 64,
        num_key_value_heads=2 if hidden == 64 else 8,
    )


def failing_trace(cls: type) -> TracedModel:
    """The trace of an untraceable pattern (see tests/patterns/untraceable.py)."""
    model = patterns.Wrapper(cls()).eval()
    generator = torch.Generator().manual_seed(0)
    sample = {"x": torch.randn(1, 6, 8, generator=generator), "grid": torch.tensor([[1, 2, 2]])}
    options = TracingOptions(sequential_targets=("Block",))
    return trace_model(model, sample, options, name=cls.__name__)


def svg_nodes(svg: str) -> dict[str, ET.Element]:
    """The graphviz node groups (``<g class="node">``) of an SVG document, by id."""
    root = ET.fromstring(svg.encode("utf-8"))
    return {g.get("id", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "node"}


def svg_edges(svg: str) -> dict[str, ET.Element]:
    """The graphviz edge groups, by their ``tail->head`` title."""
    root = ET.fromstring(svg.encode("utf-8"))
    return {
        g.find(f"{SVG}title").text or "": g  # type: ignore[union-attr]
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "edge"
    }


def fill_of(group: ET.Element) -> str:
    """The fill colour of a node's outline shape."""
    for shape in group:
        if shape.tag in (f"{SVG}polygon", f"{SVG}path", f"{SVG}ellipse") and shape.get("fill"):
            return shape.get("fill", "")
    return ""


def svg_size(svg: str) -> tuple[float, float]:
    """The picture's width and height in points, as Graphviz states them."""
    root = ET.fromstring(svg.encode("utf-8"))
    return float(root.get("width", "").removesuffix("pt")), float(
        root.get("height", "").removesuffix("pt")
    )


def svg_clusters(svg: str) -> dict[str, ET.Element]:
    """The graphviz cluster groups, by their DOT name (``cluster_...``)."""
    root = ET.fromstring(svg.encode("utf-8"))
    return {
        g.find(f"{SVG}title").text or "": g  # type: ignore[union-attr]
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "cluster"
    }


def bbox_of(group: ET.Element) -> tuple[float, float, float, float]:
    """``(left, top, right, bottom)`` of the outline of a node or cluster group."""
    for shape in group:
        if shape.tag == f"{SVG}ellipse":
            cx, cy = float(shape.get("cx", 0)), float(shape.get("cy", 0))
            rx, ry = float(shape.get("rx", 0)), float(shape.get("ry", 0))
            return cx - rx, cy - ry, cx + rx, cy + ry
        if shape.tag in (f"{SVG}polygon", f"{SVG}path"):
            text = shape.get("points") or shape.get("d") or ""
            values = [float(v) for v in re.findall(r"-?[\d.]+", text)]
            xs, ys = values[0::2], values[1::2]
            return min(xs), min(ys), max(xs), max(ys)
    raise AssertionError("a node or cluster without an outline")
