"""Save the picture of an llmc-trace page, unfolded, as a standalone SVG (for assets/).

    python scripts/page_picture.py PAGE.html OUT.svg --unfold sg-0,n-model_layers_79

Headless Chromium opens the page with ``#unfold=...`` (the page unfolds those nodes and what
hides them) and prints the document once its script has run; the page's ``<svg>`` then holds
the unfolded picture. This keeps that element, sized to the whole picture, with the page's
style for what the script drew (cards, their title bars, the + marks). Chromium lays out text
with this machine's fonts, so the file is the same from run to run on one machine only.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")


def svg_style() -> str:
    """The viewer's rules for SVG elements, as a standalone picture needs them."""
    css = resources.files("llmc_trace.render").joinpath("viewer.css").read_text(encoding="utf-8")
    rules = re.findall(r"^(g\.[^{]*|#canvas svg text)\s*\{([^}]*)\}", css, re.MULTILINE)
    return "".join(
        f"{selector.replace('#canvas svg ', '').strip()} {{{body.strip()}}}"
        for selector, body in rules
        if "cursor" not in body
    )


def page_picture(page: Path, unfold: str) -> str:
    chromium = next((found for c in CHROMIUM if (found := shutil.which(c))), None)
    if chromium is None:
        sys.exit("headless Chromium is needed: apt-get install -y chromium")
    url = f"{page.resolve().as_uri()}#unfold={unfold}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url]
    document = subprocess.run(
        [chromium, *flags], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    match = re.search(r'<div id="canvas">(<svg\b.*</svg>)</div>', document, re.DOTALL)
    if match is None:
        sys.exit(f"{page} shows no picture: is it a page llmc-trace render wrote?")
    svg = match.group(1).replace("&nbsp;", "&#160;")
    width = float(re.search(r'\bwidth="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    height = float(re.search(r'\bheight="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    svg = re.sub(
        r"\A<svg[^>]*>",
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt" '
        f'viewBox="0 0 {width:.2f} {height:.2f}"><style>{svg_style()}</style>'
        '<rect width="100%" height="100%" fill="white"/>',
        svg,
    )
    ET.fromstring(svg)  # a standalone picture must be well-formed XML
    return svg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path, help="a page written by llmc-trace render (*.html)")
    parser.add_argument("out", type=Path, help="the picture to write (*.svg)")
    parser.add_argument("--unfold", default="", help="node ids to unfold, comma-separated")
    args = parser.parse_args()
    args.out.write_text(page_picture(args.page, args.unfold), encoding="utf-8")
    print(f"Wrote {args.out}.")


if __name__ == "__main__":
    main()
