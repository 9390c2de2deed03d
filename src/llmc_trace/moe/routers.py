"""Find the linear layers that route tokens to experts, which compression keeps dense."""

from __future__ import annotations

import torch

from llmc_trace.layers.linear import as_linear
from llmc_trace.moe.fused import is_fused_experts
from llmc_trace.moe.projection import ExpertProjection


def router_layers(model: torch.nn.Module) -> list[str]:
    """The layers that route tokens to experts (or gate a shared expert), kept in full
    precision by default as published MoE checkpoints keep them: a small weight whose rounding
    would change which experts every token reaches. Found generally: in the module holding an
    experts container (fused experts, or a list of expert modules), a layer outside the experts
    with one output per expert, or a single output: a linear layer, or a module of its own
    holding that ``(outputs, hidden)`` weight (transformers 5's ``TopKRouter`` classes), which
    no method compresses but the weight coverage counts as a router."""
    found: list[str] = []
    for path, module in model.named_modules():
        count = _experts_count(path, module)
        if count is None:
            continue
        parent_path = path.rpartition(".")[0]
        parent = model.get_submodule(parent_path)
        for name, child in parent.named_modules():
            full = f"{parent_path}.{name}".strip(".")
            if full.startswith(f"{path}.") or full == path:
                continue
            if _outputs(child) in (count, 1) and full not in found:
                found.append(full)
    return found


def _outputs(module: torch.nn.Module) -> int | None:
    """How many outputs ``module`` computes from its weight, if it is a linear layer or holds
    one two-dimensional ``weight`` of its own."""
    if isinstance(module, ExpertProjection):
        return None
    if (layer := as_linear(module)) is not None:
        return layer.out_features
    weight = dict(module.named_parameters(recurse=False)).get("weight")
    return int(weight.shape[0]) if weight is not None and weight.dim() == 2 else None


def _experts_count(path: str, module: torch.nn.Module) -> int | None:
    """How many experts ``module`` holds, if it is an experts container: fused experts, or a
    list of expert modules stored under the name ``experts`` (Switch Transformers, Mixtral in
    older code)."""
    if is_fused_experts(module):
        return int(module.down_proj.shape[0])
    listed = isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
    if listed and path.rpartition(".")[2] == "experts" and len(module) > 1:
        return len(module)
    return None
