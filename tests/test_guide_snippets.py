"""The tracing guide's worked example runs as the guide says: its Python blocks, saved in
order as ``toy.py`` and run as ``python toy.py`` runs it (as ``__main__``, from its own folder,
so the file names it prints are the guide's), print its console blocks line for line (file
names and line numbers included), so an API change cannot leave the guide behind. It runs in
this process: a fresh interpreter would cost the suite its imports, ten times the example."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "guides" / "tracing.md"
#: The example starts at the sentence that tells the reader to save it, and ends with its section.
START = "Saved in order as `toy.py`"
END = "\n## "


def toy_example() -> tuple[str, str]:
    """The example's Python blocks joined by a blank line, and its console blocks joined."""
    text = GUIDE.read_text()
    start = text.index(START)
    section = text[start : text.index(END, start)]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    printed = re.findall(r"```console\n(.*?)```", section, flags=re.S)
    assert len(code) == 4 and len(printed) == 4, "the guide's toy example changed shape"
    return "\n".join(code), "".join(printed)


def test_the_toy_example_prints_what_the_guide_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, expected = toy_example()
    (tmp_path / "toy.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    runpy.run_path("toy.py", run_name="__main__")
    assert capsys.readouterr().out == expected
