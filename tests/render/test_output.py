"""Rendered files: byte-identical across runs, written atomically, valid, and self-contained."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmc_trace.errors import BadInputError
from llmc_trace.errors import DotNotFoundError
from llmc_trace.render import render, render_trace
from llmc_trace.traced.model import TracedModel
from tests.patterns import untraceable as patterns
from tests.render.helpers import failing_trace, svg_nodes


@pytest.mark.parametrize(
    ("view", "suffix", "expand"),
    [
        ("overview", ".svg", False),
        ("overview", ".html", False),
        ("detail", ".html", False),
        ("modules", ".html", True),
    ],
)
def test_same_inputs_give_byte_identical_files(
    llama_dir: Path, tmp_path: Path, view: str, suffix: str, expand: bool
) -> None:
    """Two independent traces and renders of one model give the same bytes."""
    first = render(str(llama_dir), tmp_path / f"a{suffix}", view=view, expand=expand)
    second = render(str(llama_dir), tmp_path / f"b{suffix}", view=view, expand=expand)
    assert first.path.read_bytes() == second.path.read_bytes()


def test_failure_view_is_byte_identical_too(tmp_path: Path) -> None:
    for name in ("a.html", "b.html"):
        render_trace(failing_trace(patterns.DataShape), tmp_path / name, view="failure")
    assert (tmp_path / "a.html").read_bytes() == (tmp_path / "b.html").read_bytes()


def test_outputs_name_no_absolute_path_and_no_address(llama_dir: Path, tmp_path: Path) -> None:
    out = render(str(llama_dir), tmp_path / "detail.html", view="detail").path
    text = out.read_text(encoding="utf-8")
    assert str(llama_dir) not in text and str(tmp_path) not in text
    assert llama_dir.name in text  # the folder is named by its own name only
    assert not re.search(r"0x[0-9a-f]{6,}", text)


def test_svg_is_valid_xml_and_counts_its_nodes(llama_trace: TracedModel, tmp_path: Path) -> None:
    result = render_trace(llama_trace, tmp_path / "overview.svg")
    svg = result.path.read_text(encoding="utf-8")
    ET.fromstring(svg.encode("utf-8"))
    assert len(svg_nodes(svg)) == result.num_nodes


@pytest.mark.parametrize("view", ["overview", "detail"])
def test_html_loads_nothing_from_outside(
    llama_trace: TracedModel, tmp_path: Path, view: str
) -> None:
    page = render_trace(llama_trace, tmp_path / "page.html", view=view).path.read_text()
    assert_self_contained(page)


def assert_self_contained(page: str) -> None:
    """No element, style or script of ``page`` can fetch anything."""
    assert "default-src 'none'" in page
    assert not re.search(r"<(link|img|iframe)\b", page)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert not re.search(r"url\(", page)
    # the only URLs are XML namespace names, which are never fetched
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }


def test_writing_leaves_no_temporary_file(llama_trace: TracedModel, tmp_path: Path) -> None:
    render_trace(llama_trace, tmp_path / "one.svg")
    render_trace(llama_trace, tmp_path / "one.svg")  # replaces the previous file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.svg"]


def test_missing_dot_says_how_to_install_it_and_keeps_the_old_file(
    llama_trace: TracedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "kept.svg"
    out.write_text("previous")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DotNotFoundError) as info:
        render_trace(llama_trace, out)
    assert "apt-get install -y graphviz" in info.value.hint
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.svg"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"out": "x.png"}, "out"),
        ({"out": "x.svg", "view": "everything"}, "view"),
        ({"out": "x.svg", "subgraphs": [1]}, "subgraphs"),
    ],
)
def test_bad_requests_fail_before_tracing(kwargs: dict, param: str, tmp_path: Path) -> None:
    start = time.perf_counter()
    out = tmp_path / kwargs.pop("out")
    with pytest.raises(BadInputError) as info:
        render("no/such-model-is-looked-up", out, **kwargs)
    assert info.value.param == param
    assert time.perf_counter() - start < 1.0
    assert not out.exists()


def test_an_80_layer_page_renders_in_under_10_s(llama70b_dir: Path, tmp_path: Path) -> None:
    """The page opens on 6 nodes (the inputs, the head, the folded run, the last layer, the
    shared values) and holds a picture of every subgraph to unfold into."""
    start = time.perf_counter()
    result = render(str(llama70b_dir), tmp_path / "llama70b.html")
    elapsed_s = time.perf_counter() - start
    assert result.num_nodes == 2 + 3 + 1
    data = json.loads(re.search(r'id="llmc-data">(.*?)</script>', result.path.read_text()).group(1))
    assert {f"sg:{i}" for i in range(81)} <= set(data["fragments"])
    assert elapsed_s < 10.0, f"took {elapsed_s:.1f} s"
