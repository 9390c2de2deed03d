"""The tracing guide's worked example runs as the guide says: its Python blocks, saved in
order as ``toy.py``, print its console blocks line for line (file names and line numbers
included), so an API change cannot leave the guide behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_the_toy_example_prints_what_the_guide_shows(tmp_path: Path) -> None:
    code, expected = toy_example()
    (tmp_path / "toy.py").write_text(code)
    result = subprocess.run(
        [sys.executable, "toy.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
