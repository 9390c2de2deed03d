"""The fixes ``coverage --all`` verified, per model type: offered first to real checkpoints.

The sweep proves a fix on each type's default twin; a user's checkpoint of that type runs the
same modeling code, so the fix is the first one worth a retry there (it is still verified on
the user's own model before it is used). The sweep's JSON ships with the package
(``models/builtin/coverage-all.json``, written by ``coverage --all --json``) and says which
transformers it was measured on; an entry that does not apply to another release (an
autowrap's line moved) is refused when it is installed, and the ordinary search goes on.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from llmc_trace.models.source import builtin_root

SWEEP_FILE = "coverage-all.json"


@functools.cache
def _sweep() -> dict[str, Any]:
    path = builtin_root() / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else {"rows": []}


def swept_fix(model_type: str, modality: str) -> list[str]:
    """The ``ignore`` entries the sweep verified for ``model_type`` and ``modality`` (else
    for the type's text), or none."""
    fixes = {
        row["modality"]: row["fix"].split(", ")
        for row in _sweep()["rows"]
        if row["model_type"] == model_type and row["outcome"] == "verified" and row["fix"]
    }
    return fixes.get(modality) or fixes.get("text") or []


def swept_transformers() -> str:
    """The transformers version the shipped sweep was measured on."""
    return str(_sweep().get("transformers", "unknown"))


def swept_seconds() -> dict[str, float]:
    """Seconds each model type took in the shipped sweep, its modalities together."""
    seconds: dict[str, float] = {}
    for row in _sweep()["rows"]:
        seconds[row["model_type"]] = seconds.get(row["model_type"], 0.0) + row["seconds"]
    return seconds
