"""Split a layer's calibration into passes that each hold a bounded group of experts.

Each expert projection's Hessian is alive from the start of its pass to its solve: a
256-expert layer calibrated at once holds hundreds of them. In passes of at most ``group``
experts, the layer runs once per pass and only one group's Hessians are alive at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llmc_trace.moe.projection import ExpertProjection

NamedModules = Sequence[tuple[str, torch.nn.Module]]


def expert_passes(targets: NamedModules, group: int) -> list[NamedModules] | None:
    """``targets`` in passes of at most ``group`` experts (an expert's projections together,
    every other target in the first pass), in order; ``None`` when one pass holds them all."""
    experts: dict[tuple[int, int], list[tuple[str, torch.nn.Module]]] = {}
    others = []
    for name, module in targets:
        if isinstance(module, ExpertProjection):
            experts.setdefault((id(module.state), module.expert), []).append((name, module))
        else:
            others.append((name, module))
    projections = list(experts.values())
    if len(projections) <= group:
        return None
    chunks = [projections[i : i + group] for i in range(0, len(projections), group)]
    parts: list[NamedModules] = [
        [entry for expert in chunk for entry in expert] for chunk in chunks
    ]
    parts[0] = others + list(parts[0])
    return parts
