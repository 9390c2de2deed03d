"""Reading a model folder's JSON files, with the error a person can act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmc_trace.errors import BadInputError


def read_json(path: Path) -> dict[str, Any]:
    """The JSON document at ``path`` (a model folder's config, processor or template file);
    malformed JSON is bad input naming the file and the line."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BadInputError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}).",
            hint="Restore the file from the checkpoint it came from.",
            param="model",
        ) from err
