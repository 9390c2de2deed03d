"""Reading a model folder's JSON files and checking where an output can go, with the error a
person can act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmc_trace.errors import BadInputError

#: JSON's names for the Python types ``json.loads`` returns, for a file that holds the wrong one.
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}  # fmt: skip


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object at ``path`` (a model folder's config, processor or template file);
    a file that cannot be read, is not JSON, or holds something other than an object of
    settings is bad input naming the file (and the line)."""
    restore = "Restore the file from the checkpoint it came from."
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise BadInputError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}).",
            hint=restore,
            param="model",
        ) from err
    except UnicodeDecodeError as err:
        raise BadInputError(
            f"{path} is not UTF-8 text (byte {err.start}).", hint=restore, param="model"
        ) from err
    except OSError as err:
        raise BadInputError(
            f"{path} cannot be read ({err.strerror or err}).",
            hint="Check that the file is readable by this user, or restore it.",
            param="model",
        ) from err
    if not isinstance(document, dict):
        raise BadInputError(
            f"{path} holds {_JSON_KINDS.get(type(document), 'a value')}, not a JSON object of "
            "settings.",
            hint=restore,
            param="model",
        )
    return document


def check_parent_folders(out: Path, param: str = "out") -> None:
    """Refuse an output path under a file (``--out notes.txt/model``): creating its folders
    would fail with "File exists", which names neither the file nor the fix. Missing folders
    are fine (the writers create them)."""
    for parent in out.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise BadInputError(
                    f"{out} lies under {parent}, which is a file, not a folder.",
                    hint=f"Choose a --{param} whose parents are folders (missing ones are "
                    "created).",
                    param=param,
                )
            return
