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
    attn_implementation: str | None = None
    true_sequential: bool | None = None
    refine_passes: int | None = None


def render_recipe(
    recipe: Recipe, schemes: Sequence[QuantizationScheme], sparsity: Sparsity | None
) -> str:
    """`recipe.yaml`'s text: the same inputs always give the same bytes.

    Values are written as JSON scalars and flow sequences, which YAML reads unchanged, so the
    file needs no YAML library to write and any YAML library to read.
    """
    lines = [
        "# How this checkpoint was made (written by llmc-trace).",
        f"method: {_yaml_value(recipe.method)}",
    ]
    lines.append("schemes:" if schemes else "schemes: []")
    for scheme in schemes:
        lines.append(f"  - name: {_yaml_value(scheme.name)}")
        lines.append(f"    weights: {_yaml_mapping(dataclasses.asdict(scheme.weights))}")
        activations = scheme.input_activations
        lines.append(
            "    input_activations: "
            + ("null" if activations is None else _yaml_mapping(dataclasses.asdict(activations)))
        )
        lines.append(f"    targets: {_yaml_value(list(scheme.targets))}")
        lines.append(f"    ignore: {_yaml_value(list(scheme.ignore))}")
    if sparsity is None:
        lines.append("sparsity: null")
    else:
        fraction = 1 - sparsity[0] / sparsity[1] if isinstance(sparsity, tuple) else sparsity
        lines.append(
            f"sparsity: {_yaml_mapping({'structure': sparsity_structure(sparsity), 'fraction': fraction})}"
        )
    lines.append("calibration:")
    for key in (
        "num_samples",
        "seq_len",
        "pipeline",
        "seed",
        "attn_implementation",
        "true_sequential",
    ):
        lines.append(f"  {key}: {_yaml_value(getattr(recipe, key))}")
    lines.append(f"percdamp: {_yaml_value(recipe.percdamp)}")
    lines.append(f"blocksize: {_yaml_value(recipe.blocksize)}")
    lines.append(f"refine_passes: {_yaml_value(recipe.refine_passes)}")
    return "\n".join(lines) + "\n"


def _yaml_value(value: object) -> str:
    return json.dumps(value)


def _yaml_mapping(values: dict[str, object]) -> str:
    return "{" + ", ".join(f"{key}: {_yaml_value(value)}" for key, value in values.items()) + "}"
