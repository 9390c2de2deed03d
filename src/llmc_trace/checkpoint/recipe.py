"""Record how a checkpoint was made, as the deterministic `recipe.yaml` written beside it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass

from llmc_trace.checkpoint.layout import sparsity_structure
from llmc_trace.compress.scheme import QuantizationScheme
from llmc_trace.compress.sparsegpt import Sparsity


@dataclass(frozen=True)
class Recipe:
    """The calibration facts behind a checkpoint; the writer adds the schemes and sparsity.

    `method` names what ran, e.g. "gptq", "rtn", "sparsegpt", "magnitude"; `pipeline` how the
    calibration data reached the layers (e.g. "sequential"). None means "not applicable" (no
    calibration data for round-to-nearest, for instance).
    """

    method: str
    num_samples: int | None = None
    seq_len: int | None = None
    pipeline: str | None = None
    seed: int | None = None
    percdamp: float | None = None
    blocksize: int | None = None


def render_recipe(
    recipe: Recipe, schemes: Sequence[QuantizationScheme], sparsity: Sparsity | None
) -> str:
    """`recipe.yaml`'s text: the same inputs always give the same bytes.

    Values are written as JSON scalars and flow sequences, which YAML reads unchanged, so the
    file needs no YAML library to write and any YAML library to read.
    """
    lines = [
        "# How this checkpoint was made (written by llmc-trace).",
        f"method: {_v(recipe.method)}",
    ]
    lines.append("schemes:" if schemes else "schemes: []")
    for scheme in schemes:
        lines.append(f"  - name: {_v(scheme.name)}")
        lines.append(f"    weights: {_mapping(dataclasses.asdict(scheme.weights))}")
        activations = scheme.input_activations
        lines.append(
            "    input_activations: "
            + ("null" if activations is None else _mapping(dataclasses.asdict(activations)))
        )
        lines.append(f"    targets: {_v(list(scheme.targets))}")
        lines.append(f"    ignore: {_v(list(scheme.ignore))}")
    if sparsity is None:
        lines.append("sparsity: null")
    else:
        fraction = 1 - sparsity[0] / sparsity[1] if isinstance(sparsity, tuple) else sparsity
        lines.append(
            f"sparsity: {_mapping({'structure': sparsity_structure(sparsity), 'fraction': fraction})}"
        )
    lines.append("calibration:")
    for key in ("num_samples", "seq_len", "pipeline", "seed"):
        lines.append(f"  {key}: {_v(getattr(recipe, key))}")
    lines.append(f"percdamp: {_v(recipe.percdamp)}")
    lines.append(f"blocksize: {_v(recipe.blocksize)}")
    return "\n".join(lines) + "\n"


def _v(value: object) -> str:
    return json.dumps(value)


def _mapping(values: dict[str, object]) -> str:
    return "{" + ", ".join(f"{key}: {_v(value)}" for key, value in values.items()) + "}"
