"""Estimate what the compressor keeps per sequential target, and gather each pipeline's peak.

Each pipeline's formula lives beside its runner (:mod:`llmc_trace.pipelines`, through its
:class:`~llmc_trace.pipelines.calibration.Pipeline` record); :func:`estimate_pipelines` fills
their one :class:`~llmc_trace.pipelines.estimate.EstimateInputs` from the full-size trace on
``meta`` and asks every pipeline in the registry's order.

Inside a sequential target the graph is opaque, so a decoder layer's working memory comes from
its config: eager attention scores (``B·H·S²`` in float32 plus a copy in the model dtype) and
the MLP's intermediate activations. ``compress`` calibrates with sdpa by default, which holds
no score matrix, so there the scores term is an upper bound.

The compressor's state is counted where the pipelines keep it
(:class:`~llmc_trace.pipelines.estimate.CompressorCost`): one float32 Hessian per distinct
Linear *input* (q/k/v share one, gate/up share one; a GPT-2 ``Conv1D`` counts as the Linear it
computes, :mod:`~llmc_trace.layers.linear`), found by running each target once on ``meta``, all
alive while the target calibrates; while it is compressed, Linear by Linear, the Hessians not
yet given up plus one solver call's working memory (the two phases do not overlap, so a device
peak is the larger of them); and the integer weights kept on the host until their module is
written (or, in memory, to the end). Fused MoE experts count from their parameters' shapes
(:func:`expert_hessians`): two Hessians per expert (gate and up share one, down has its own),
as many experts alive at once as the run's ``expert_group`` lets calibrate together (all of a
layer's by default): hundreds of Hessians for a 256-expert layer, which is what
``--expert-group`` bounds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from transformers import PretrainedConfig

from llmc_trace.core.sizes import parameter_bytes
from llmc_trace.graph.partition import PartitionedTrace
from llmc_trace.layers.linear import LinearLayer, as_linear, is_linear
from llmc_trace.moe import ExpertProjection, is_fused_experts
from llmc_trace.pipelines.estimate import (
    PLAN_BATCH,
    PLAN_SEQ,
    CompressorCost,
    EstimateInputs,
    PipelineEstimate,
    RunSettings,
    transient_bytes,
)
from llmc_trace.pipelines.registry import PIPELINES


def solver_bytes(linear: torch.nn.Module, *, gives_up_hessian: bool = True) -> int:
    """Peak working bytes of one GPTQ (or SparseGPT) call on ``linear`` (a linear layer, see
    :func:`~llmc_trace.layers.linear.as_linear`), its Hessian given.

    Factorising works in one ``in × in`` float32 matrix, the Hessian itself when the call is
    its last user (``gives_up_hessian``: the compressor hands a shared Hessian to the last of
    its Linears) or a copy of it, plus one more (the Cholesky factor, or LAPACK's workspace);
    next to them two ``out × in`` ones (the float32 working weight and the stored-dtype one).
    The column sweep then holds the factor (in the Hessian's place when given up) and about six
    ``out × in`` float32-sized arrays (the working weight, the block's updates, the integer
    grid, the dequantized result). ``benchmarks/pipeline_memory.py`` prints one call's
    measured peak against this.
    """
    layer = _linear(linear)
    return solve_bytes(layer.out_features, layer.in_features, gives_up_hessian=gives_up_hessian)


def solve_bytes(rows: int, cols: int, *, gives_up_hessian: bool = True) -> int:
    """:func:`solver_bytes` of a ``rows × cols`` (out × in) weight."""
    copy = 0 if gives_up_hessian else 1
    return 4 * max((1 + copy) * cols * cols + 2 * rows * cols, copy * cols * cols + 6 * rows * cols)


def shared_input_groups(
    target: torch.nn.Module, node: fx.Node | None
) -> list[list[torch.nn.Module]] | None:
    """The target's linear layers grouped by the input tensor they read, or ``None`` if unknown.

    Runs the target once on ``meta`` with the traced call's example arguments and records the
    input object each Linear receives, which is exactly how the compressor decides to share a
    Hessian. A Linear the forward never reaches gets a group of its own. Experts' projections
    are counted apart, from their shapes (:func:`expert_hessians`).
    """
    linears = [m for m in target.modules() if is_linear(m) and not isinstance(m, ExpertProjection)]
    if node is None or not linears:
        return None
    missing = False

    def example(arg: fx.Node) -> Any:
        nonlocal missing
        value = arg.meta.get("val")
        missing = missing or value is None
        return value

    args = fx.node.map_arg(node.args, example)
    kwargs = fx.node.map_arg(node.kwargs, example)
    if missing:
        return None
    seen: list[tuple[torch.Tensor, list[torch.nn.Module]]] = []

    def record(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
        for tensor, members in seen:
            if tensor is inputs[0]:
                members.append(module)
                return
        seen.append((inputs[0], [module]))

    handles = [m.register_forward_pre_hook(record) for m in linears]
    try:
        with torch.no_grad():
            target(*args, **kwargs)
    except Exception:  # a layer that cannot run on meta (data-dependent routing): unknown
        return None
    finally:
        for handle in handles:
            handle.remove()
    grouped = {id(m) for _, members in seen for m in members}
    return [members for _, members in seen] + [[m] for m in linears if id(m) not in grouped]


def compressor_costs(
    model: torch.nn.Module, partitioned: PartitionedTrace | None, settings: RunSettings
) -> list[CompressorCost]:
    """One :class:`CompressorCost` per sequential target (every linear layer when untraced)."""
    nodes: dict[str, fx.Node] = {}
    if partitioned is not None:
        nodes = {str(n.target): n for n in partitioned.trace.target_nodes}
    targets = _target_modules(model, partitioned)
    paths = list(partitioned.trace.leaves.targets) if partitioned is not None else []
    memo: dict[tuple[Any, ...], list[list[str]] | None] = {}
    costs = []
    for index, target in enumerate(targets):
        linears = [
            m for m in target.modules() if is_linear(m) and not isinstance(m, ExpertProjection)
        ]
        key = (type(target), tuple((n, tuple(p.shape)) for n, p in target.named_parameters()))
        if key not in memo:
            names = {id(m): n for n, m in target.named_modules()}
            node = nodes.get(paths[index]) if index < len(paths) else None
            groups = shared_input_groups(target, node)
            memo[key] = None if groups is None else [[names[id(m)] for m in g] for g in groups]
        relative = memo[key]
        if relative is None:
            groups = [[m] for m in linears]
        else:
            groups = [[target.get_submodule(n) for n in group] for group in relative]
        column2 = settings.hessian_bytes_per_column2 if settings.needs_data else 0
        sizes = [_linear(group[0]).in_features ** 2 * column2 for group in groups]
        # the compressor gives each Hessian up to the last of its Linears it compresses; while
        # Linear i is compressed, the Hessians whose last Linear is i or later are alive
        position = {id(m): i for i, m in enumerate(linears)}
        ends = [max(position[id(m)] for m in group) for group in groups]
        compress = max(
            (
                sum(size for end, size in zip(ends, sizes) if end >= i)
                + (solver_bytes(m, gives_up_hessian=i in ends) if column2 else 0)
                for i, m in enumerate(linears)
            ),
            default=0,
        )
        experts = expert_hessians(target, column2, settings.expert_group)
        costs.append(
            CompressorCost(
                hessian_bytes=sum(sizes) + experts.alive_bytes,
                compress_bytes=max(compress, sum(sizes) + experts.alive_bytes + experts.solve_bytes)
                if column2
                else compress,
                kept_bytes=int(
                    (sum(m.weight.numel() for m in linears) + experts.weights)
                    * settings.kept_bytes_per_weight
                ),
                widest_input=max((_linear(g[0]).in_features for g in groups), default=0)
                if column2
                else 0,
            )
        )
    return costs


@dataclass(frozen=True)
class ExpertHessians:
    """The Hessians a target's fused experts need: per expert one for gate and up (they read
    the same tokens) and one for down; ``alive_bytes`` of them at once when at most ``group``
    experts calibrate together (``all_bytes`` were all of them), and one solve's working
    memory."""

    count: int
    alive: int
    alive_bytes: int
    all_bytes: int
    solve_bytes: int
    weights: int


def expert_hessians(target: torch.nn.Module, column2: int, group: int | None) -> ExpertHessians:
    """:class:`ExpertHessians` of every fused experts module inside ``target``, from the
    parameters' shapes alone (works on ``meta``, projections installed or not)."""
    count = alive = alive_bytes = all_bytes = solve = weights = 0
    for module in target.modules():
        if not is_fused_experts(module):
            continue
        experts, hidden, inner = _expert_widths(module)
        per_expert = (hidden**2 + inner**2) * column2
        together = experts if group is None else min(group, experts)
        count += 2 * experts
        alive += 2 * together
        alive_bytes += together * per_expert
        all_bytes += experts * per_expert
        if column2:  # gate keeps the Hessian up shares; down gives its own up
            gate = solve_bytes(inner, hidden, gives_up_hessian=False)
            solve = max(solve, gate, solve_bytes(hidden, inner))
        weights += sum(p.numel() for p in module.parameters(recurse=False) if p.dim() == 3)
    return ExpertHessians(count, alive, alive_bytes, all_bytes, solve, weights)


def moe_layer_hessians(
    model: torch.nn.Module, settings: RunSettings
) -> tuple[int, ExpertHessians] | None:
    """How many MoE layers ``model`` has and the largest one's :class:`ExpertHessians` under
    ``settings`` (``None`` without fused experts, or for a run that needs no data)."""
    layers = [m for m in model.modules() if is_fused_experts(m)]
    if not layers or not settings.needs_data:
        return None
    column2, group = settings.hessian_bytes_per_column2, settings.expert_group
    largest = max((expert_hessians(m, column2, group) for m in layers), key=lambda e: e.all_bytes)
    return len(layers), largest


def _expert_widths(module: torch.nn.Module) -> tuple[int, int, int]:
    """Experts, hidden width (gate/up input) and inner width (down input) of fused experts."""
    down = module.down_proj  # (experts, hidden, inner), or (experts, inner, hidden) transposed
    experts, rows, cols = (int(d) for d in down.shape)
    hidden, inner = (cols, rows) if module.is_transposed else (rows, cols)
    return experts, hidden, inner


def layer_working_bytes(
    config: PretrainedConfig, batch: int, seq: int, dtype_bytes: int, *, scores_kept: bool = True
) -> int:
    """Activations alive inside one decoder layer: attention scores and MLP intermediates.

    ``scores_kept=False`` is for attention that never holds the (seq, seq) scores: PyTorch's
    fused attention on a GPU (flash or memory-efficient kernels) keeps one float32 row
    statistic per query instead. At an 8B model's 8 x 2048 tokens the scores were 6 of the
    plan's 14.2 GiB, and the H200 run's peak was 5.3 GiB."""
    text = getattr(config, "text_config", None) or config
    heads = getattr(text, "num_attention_heads", 1) or 1
    hidden = getattr(text, "hidden_size", 0) or 0
    inner = (
        getattr(text, "intermediate_size", None)
        or getattr(text, "moe_intermediate_size", None)
        or 4 * hidden
    )
    scores = batch * heads * seq * (seq * (4 + dtype_bytes) if scores_kept else 4)
    mlp = 3 * batch * seq * inner * dtype_bytes
    residual = 4 * batch * seq * hidden * dtype_bytes
    return scores + mlp + residual


def estimate_pipelines(
    model: torch.nn.Module,
    partitioned: PartitionedTrace | None,
    settings: RunSettings,
    invariant: set[str] = frozenset(),  # type: ignore[assignment]
    traced: tuple[int, int] = (PLAN_BATCH, PLAN_SEQ),
) -> list[PipelineEstimate]:
    """Estimates for every pipeline that can run this model (sequential needs a trace).

    ``invariant`` names the intermediates that are equal for every sample (see
    :mod:`~llmc_trace.plan.invariants`): the caches hold them once. ``traced`` is the
    ``(batch, sequence)`` size the graph's example values were traced at.
    """
    inputs = EstimateInputs(
        model,
        partitioned,
        settings,
        invariant,
        traced,
        targets=_target_modules(model, partitioned),
        costs=compressor_costs(model, partitioned, settings),
        weights=parameter_bytes(list(model.modules()), settings.storage_bytes),
        working=layer_working_bytes(
            model.config,
            settings.batch_size,
            settings.seq_len,
            settings.dtype_bytes,
            scores_kept=settings.device_is_host or not _fused_attention(model, settings.attention),
        ),
    )
    if partitioned is not None:
        between = max(
            (transient_bytes(s.graph, inputs.size) for s in partitioned.subgraphs if not s.targets),
            default=0,
        )
        inputs = dataclasses.replace(inputs, between=between)
    estimates = [pipeline.estimate(inputs) for pipeline in PIPELINES.values()]
    return [estimate for estimate in estimates if estimate is not None]


def _fused_attention(model: torch.nn.Module, attention: str) -> bool:
    """Whether calibration's attention (``attention``, the kernel asked for) runs through
    ``scaled_dot_product_attention``, which on a GPU never holds the whole score matrix: the
    model must support it, else loading falls back to ``eager``."""
    return attention == "sdpa" and bool(getattr(type(model), "_supports_sdpa", False))


def _target_modules(
    model: torch.nn.Module, partitioned: PartitionedTrace | None
) -> list[torch.nn.Module]:
    if partitioned is not None:
        return [model.get_submodule(p) for p in partitioned.trace.leaves.targets]
    return [m for m in model.modules() if is_linear(m)]


def _linear(module: torch.nn.Module) -> LinearLayer:
    layer = as_linear(module)
    assert layer is not None, f"{type(module).__name__} is not a linear layer"
    return layer
