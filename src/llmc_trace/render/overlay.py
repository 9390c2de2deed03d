"""``Overlay``: per-module values drawn on the page as fill colours, with a legend and tooltips.

Other parts of llmc-trace (the compression report colours each layer by its relative loss)
and users' own code attach a number in [0, 1] to module paths; the page paints every box that
stands for such a module, from pale (0) to red (1), and says the value and a note on hover.
A box standing for several modules shows the largest of their values: on a folded run of 79
layers, the worst layer is the one to see. A module with no value of its own shows the
largest value below it, so the layer box of a model whose ``Linear`` layers carry the values
is coloured by its worst ``Linear``.

>>> overlay = Overlay("relative loss", {"model.layers.0": 0.2, "model.layers.1.mlp": 0.9})
>>> overlay.value_of("model.layers.1"), overlay.value_of("model.layers.0"), overlay.value_of("lm_head")
(0.9, 0.2, None)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmc_trace.errors import BadInputError

#: The colour scale from 0 to 1 (sequential, light to dark, black text stays readable).
SCALE = ("#fff7ec", "#fdd49e", "#fc8d59", "#d7301f")


@dataclass(frozen=True)
class Overlay:
    """Values in [0, 1] per module path, drawn as colour; see the module docstring.

    ``label`` titles the legend (``"relative loss"``); ``low`` and ``high`` name its ends;
    ``notes`` adds a line per module to its tooltip (``"GPTQ loss 0.031, RTN 0.044"``).
    """

    label: str
    values: Mapping[str, float]
    notes: Mapping[str, str] = field(default_factory=dict)
    low: str = "0"
    high: str = "1"

    def __post_init__(self) -> None:
        bad = [
            f"{path}={value!r}"
            for path, value in self.values.items()
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0
        ]
        if bad:
            raise BadInputError(
                f"Overlay {self.label!r} has values outside [0, 1]: {', '.join(bad[:3])}.",
                hint="Scale the values into [0, 1] (e.g. divide by the largest) and say what "
                "1 means in `high`.",
                param="overlay",
            )
        # every path at or above a valued one -> (its value, the valued path it comes from)
        worst: dict[str, tuple[float, str]] = {}
        for path, value in self.values.items():
            parts = path.split(".")
            for end in range(len(parts), 0, -1):
                prefix = ".".join(parts[:end])
                if prefix not in worst or value > worst[prefix][0]:
                    worst[prefix] = (float(value), path)
        for path, value in self.values.items():
            worst[path] = (float(value), path)  # a module's own value wins over its children's
        object.__setattr__(self, "_worst", worst)

    def value_of(self, path: str) -> float | None:
        """The value of ``path``, else the largest value below it, else ``None``."""
        found = self._worst.get(path)  # type: ignore[attr-defined]
        return None if found is None else found[0]

    def describe(self, paths: Iterable[str]) -> tuple[float, str] | None:
        """The value and tooltip of a box standing for the modules at ``paths``: the largest
        value, the module it comes from when that is not the box's own, and its note."""
        paths = list(paths)
        found = [self._worst[p] for p in paths if p in self._worst]  # type: ignore[attr-defined]
        if not found:
            return None
        value, source = max(found)
        named = "" if paths == [source] else f" ({source})"
        note = f"\n{self.notes[source]}" if source in self.notes else ""
        return value, f"{self.label} {value:.3g}{named}{note}"

    def check_paths(self, known: Iterable[str]) -> None:
        """Raise :class:`BadInputError` for a path the model does not have (a typo colours
        nothing, silently)."""
        names = set(known)
        unknown = [path for path in self.values if path not in names]
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=3)
            raise BadInputError(
                f"Overlay {self.label!r} names modules the model does not have: "
                f"{', '.join(unknown[:3])}{' …' if len(unknown) > 3 else ''}.",
                hint="Use module paths as model.named_modules() gives them"
                + (f", e.g. {', '.join(close)}." if close else "."),
                param="overlay",
            )

    def to_json(self, nodes: Mapping[str, Iterable[str]]) -> dict[str, Any]:
        """What the page needs: the legend, the value and tooltip of each node it draws from
        the start (``nodes`` maps node ids to the module paths they stand for), and of each
        module path with a value at or below it, for the boxes it names as it unfolds."""
        described = {key: self.describe(stands) for key, stands in nodes.items()}
        per_path = {path: self.describe([path]) for path in self._worst}  # type: ignore[attr-defined]
        return {
            "label": self.label,
            "low": self.low,
            "high": self.high,
            "scale": list(SCALE),
            "nodes": {k: [round(v[0], 6), v[1]] for k, v in described.items() if v},
            "paths": {k: [round(v[0], 6), v[1]] for k, v in per_path.items() if v},
        }
