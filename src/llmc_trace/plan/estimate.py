"""Estimate each pipeline's peak device and host bytes from a traced graph and run settings.

Everything comes from the full-size trace on ``meta``: parameter bytes per subgraph, and the
bytes of every intermediate, measured at the tracing sample's batch and sequence sizes and
scaled to the run's (a dimension equal to the tracing sequence length scales with the run's;
the tracing sizes are chosen so they collide with no model width). Values that are the same
for every sample (masks, rotary tables) are counted once per batch shape, as the cache stores
them.

Inside a sequential target the graph is opaque, so a decoder layer's working memory comes from
its config: eager attention scores (``B·H·S²`` in float32 plus a copy in the model dtype) and
the MLP's intermediate activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from llmc_trace.graph.partition import PartitionedTrace

#: Batch and sequence sizes of the planning trace, chosen to match no model dimension.
PLAN_BATCH = 3
PLAN_SEQ = 29


@dataclass(frozen=True)
class RunSettings:
    """What the calibration run will do."""

    samples: int
    seq_len: int
    batch_size: int = 1
    dtype_bytes: int = 2
    hessian_bytes_per_column2: int = 4  # a float32 Hessian: cols² × 4 bytes per target Linear
    needs_data: bool = True


@dataclass(frozen=True)
class PipelineEstimate:
    """Peak bytes of one pipeline; ``device`` and ``host`` are separate memories."""

    pipeline: str
    device_bytes: int
    host_bytes: int
    cache_bytes: int
    detail: str


def scaled_bytes(value: Any, batch: int, seq: int) -> int:
    """Bytes of ``value`` at the run's batch and sequence size (see module docstring)."""
    if isinstance(value, torch.Tensor):
        factor = 1.0
        for i, dim in enumerate(value.shape):
            if dim == PLAN_SEQ:
                factor *= seq / PLAN_SEQ
            elif dim == PLAN_BATCH and i == 0:
                factor *= batch / PLAN_BATCH
        return int(value.numel() * value.element_size() * factor)
    if isinstance(value, dict):
        return sum(scaled_bytes(v, batch, seq) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(scaled_bytes(v, batch, seq) for v in value)
    return 0


def linear_hessian_bytes(module: torch.nn.Module, per_column2: int) -> int:
    return sum(
        m.in_features * m.in_features * per_column2
        for m in module.modules()
        if isinstance(m, torch.nn.Linear)
    )


def layer_working_bytes(config: PretrainedConfig, batch: int, seq: int, dtype_bytes: int) -> int:
    """Activations alive inside one decoder layer: attention scores and MLP intermediates."""
    text = getattr(config, "text_config", None) or config
    heads = getattr(text, "num_attention_heads", 1) or 1
    hidden = getattr(text, "hidden_size", 0) or 0
    inner = (
        getattr(text, "intermediate_size", None)
        or getattr(text, "moe_intermediate_size", None)
        or 4 * hidden
    )
    scores = batch * heads * seq * seq * (4 + dtype_bytes)
    mlp = 3 * batch * seq * inner * dtype_bytes
    residual = 4 * batch * seq * hidden * dtype_bytes
    return scores + mlp + residual


def estimate_pipelines(
    model: torch.nn.Module,
    partitioned: PartitionedTrace | None,
    settings: RunSettings,
    invariant: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[PipelineEstimate]:
    """Estimates for every pipeline that can run this model (sequential needs a trace).

    ``invariant`` names the intermediates that are equal for every sample (see
    :mod:`~llmc_trace.plan.invariants`): the sequential cache holds them once.
    """
    batches = -(-settings.samples // settings.batch_size)
    b, s = settings.batch_size, settings.seq_len
    weights = sum(p.numel() * settings.dtype_bytes for p in model.parameters())
    targets = _target_modules(model, partitioned)
    hessians = [linear_hessian_bytes(t, settings.hessian_bytes_per_column2) for t in targets]
    working = layer_working_bytes(model.config, b, s, settings.dtype_bytes)
    hidden_state = (
        b
        * s
        * getattr(getattr(model.config, "text_config", None) or model.config, "hidden_size", 0)
        * settings.dtype_bytes
    )
    logits = b * s * _vocab(model.config) * 4
    state = hessians if settings.needs_data else [0] * len(hessians)
    estimates = []
    if partitioned is not None:
        estimates.append(
            _sequential(model, partitioned, settings, batches, weights, working, invariant)
        )
    largest_target = max(
        (sum(p.numel() for p in t.parameters()) * settings.dtype_bytes for t in targets), default=0
    )
    per_batch_kwargs = _per_batch_kwargs(partitioned, b, s)
    estimates.append(
        PipelineEstimate(
            "layer_sequential",
            device_bytes=largest_target
            + max(state, default=0)
            + working
            + 2 * hidden_state
            + per_batch_kwargs,
            host_bytes=weights + batches * (hidden_state + per_batch_kwargs),
            cache_bytes=batches * (hidden_state + per_batch_kwargs),
            detail="one target on the device; every batch's hidden states and layer arguments on the host",
        )
    )
    estimates.append(
        PipelineEstimate(
            "basic",
            device_bytes=weights + sum(state) + working + logits,
            host_bytes=weights,
            cache_bytes=0,
            detail="the whole model and every compressor's state on the device at once",
        )
    )
    estimates.append(
        PipelineEstimate(
            "data_free",
            device_bytes=largest_target,
            host_bytes=weights,
            cache_bytes=0,
            detail="weights only, one target at a time",
        )
    )
    return estimates


def _sequential(
    model: torch.nn.Module,
    partitioned: PartitionedTrace,
    settings: RunSettings,
    batches: int,
    weights: int,
    working: int,
    invariant: set[str],
) -> PipelineEstimate:
    b, s = settings.batch_size, settings.seq_len
    values = {n.name: n.meta.get("val") for n in partitioned.trace.graph.nodes}
    live: dict[str, int] = {}
    peak_cache = 0
    peak_device = 0
    for subgraph in partitioned.subgraphs:
        params = {id(p): p for m in subgraph.submodules(model) for p in m.parameters(recurse=False)}
        param_bytes = sum(p.numel() for p in params.values()) * settings.dtype_bytes
        hessian = (
            sum(
                linear_hessian_bytes(model.get_submodule(t), settings.hessian_bytes_per_column2)
                for t in subgraph.targets
            )
            if settings.needs_data
            else 0
        )
        io = sum(
            scaled_bytes(values.get(n), b, s) for n in subgraph.input_names + subgraph.output_names
        )
        layer = working if subgraph.targets else 0
        peak_device = max(peak_device, param_bytes + hessian + io + layer)
        for name in subgraph.output_names:
            per_batch = scaled_bytes(values.get(name), b, s)
            live[name] = per_batch if name in invariant else per_batch * batches
        for name in subgraph.consumed_names:
            live.pop(name, None)
        peak_cache = max(peak_cache, sum(live.values()))
    return PipelineEstimate(
        "sequential",
        device_bytes=peak_device,
        host_bytes=weights + peak_cache,
        cache_bytes=peak_cache,
        detail="one subgraph on the device; cross-subgraph values of every batch on the host",
    )


def _per_batch_kwargs(partitioned: PartitionedTrace | None, batch: int, seq: int) -> int:
    """Bytes of a target's non-hidden arguments (mask, rotary) that layer_sequential keeps per batch."""
    if partitioned is None or not partitioned.trace.target_nodes:
        return 0
    first = partitioned.trace.target_nodes[0]
    inputs = first.all_input_nodes[1:]
    return sum(scaled_bytes(n.meta.get("val"), batch, seq) for n in inputs)


def _target_modules(
    model: torch.nn.Module, partitioned: PartitionedTrace | None
) -> list[torch.nn.Module]:
    if partitioned is not None:
        return [model.get_submodule(p) for p in partitioned.trace.leaves.targets]
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def _vocab(config: PretrainedConfig) -> int:
    text = getattr(config, "text_config", None) or config
    return getattr(text, "vocab_size", 0) or 0
