"""MkDocs hooks: the guides show the pictures of the top-level ``assets/`` folder.

The pages live in ``guides/`` and link pictures as ``../assets/NAME.svg``, which is right where
they are read as files (on a forge, in an editor). MkDocs only publishes files under its
``docs_dir``, so these hooks add every file of ``assets/`` to the site under ``assets/`` and
point the pages' links there: one copy of each picture, drawn by ``make assets``, and a strict
build still checks that each linked picture exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ASSETS = Path(__file__).resolve().parent.parent / "assets"
LINK = re.compile(r"\]\(\.\./assets/")


def on_files(files: Files, config: Any) -> Files:
    for path in sorted(ASSETS.iterdir()):
        if path.is_file():
            files.append(
                File.generated(config, f"assets/{path.name}", abs_src_path=str(path))
            )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return LINK.sub("](assets/", markdown)
