"""Estimate each pipeline's peak device and host bytes from a traced graph and run settings.

Everything comes from the full-size trace on ``meta``: parameter bytes per subgraph, and the
bytes of every intermediate, measured at the tracing sample's batch and sequence sizes and
scaled to the run's (a dimension equal to the tracing sequence length scales with the run's;
the tracing sizes are chosen so they collide with no model width). Values that are the same
for every sample (masks, rotary tables) are counted once, as the caches store them.

Inside a sequential target the graph is opaque, so a decoder layer's working memory comes from
its config: eager attention scores (``B·H·S²`` in float32 plus a copy in the model dtype) and
the MLP's intermediate activations. ``compress`` calibrates with sdpa by default, which holds
no score matrix, so there the scores term is an upper bound.

The compressor's state is counted where the pipelines keep it (:class:`CompressorCost`): one
float32 Hessian per distinct Linear *input* (q/k/v share one, gate/up share one; a GPT-2
``Conv1D`` counts as the Linear it computes, :mod:`~llmc_trace.layers.linear`), found by
running each target once on ``meta``, all alive while the target calibrates; while it is
compressed, Linear by Linear, the Hessians not yet given up plus one solver call's working
memory (the two phases do not overlap, so a device peak is the larger of them); and the
integer weights kept on the host until their module is written (or, in memory, to the end).
Fused MoE experts count from their parameters' shapes (:func:`expert_hessians`): two Hessians
per expert (gate and up share one, down has its own), as many experts alive at once as the
run's ``expert_group`` lets calibrate together (all of a layer's by default): hundreds of
Hessians for a 256-expert layer, which is what ``--expert-group`` bounds.

Where the weights are follows :mod:`~llmc_trace.pipelines.residency`: in memory, the host
holds every weight in the checkpoint's dtype and the device one group in the compute dtype;
streamed, the host holds one group's pages of the checkpoint while it is read and nothing
after. On a CPU run the device *is* the host, so the host figure includes the device's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from transformers import PretrainedConfig

from llmc_trace.moe import ExpertProjection, is_fused_experts
from llmc_trace.layers.linear import LinearLayer, as_linear, is_linear
from llmc_trace.core.names import BASIC, DATA_FREE, LAYER_SEQUENTIAL, SEQUENTIAL
from llmc_trace.core.sizes import parameter_bytes
from llmc_trace.graph.partition import PartitionedTrace
from llmc_trace.pipelines.callbacks import modules_outside

#: Batch and sequence sizes of the planning trace, chosen to match no model dimension.
PLAN_BATCH = 3
PLAN_SEQ = 29


@dataclass(frozen=True)
class RunSettings:
    """What the calibration run will do."""

    samples: int
    seq_len: int
    batch_size: int = 1
    dtype_bytes: int = 2  # the compute dtype: weights on the device, activations
    storage_bytes: int = 2  # the checkpoint's dtype: weights on the host
    hessian_bytes_per_column2: int = 4  # a float32 Hessian: cols² × 4 bytes per distinct input
    needs_data: bool = True
    #: Host bytes kept per compressed weight until the checkpoint is written: the int8 grid
    #: values (scales add under 2 % at group 128); the dense weight stays in its module, on a
    #: GPU run too. Pruning alone keeps nothing.
    kept_bytes_per_weight: float = 1.0
    #: Weights read from the checkpoint part by part (compress with an output folder).
    streamed: bool = False
    #: Calibration runs on the CPU: device and host are one memory.
    device_is_host: bool = False
    #: Experts whose Hessians are alive at once in an MoE layer (``None``: all of a layer's).
    expert_group: int | None = None

    def host_bytes(
        self, device: int, group: int, weights: int, cache: int, kept: int, kept_group: int
    ) -> int:
        """Host peak from the device peak and the weights: ``group`` is the largest group's
        parameter count times ``dtype_bytes`` (what the device holds of it), ``weights`` all
        of the model's at ``storage_bytes`` (see the module docstring)."""
        # the group in the stored dtype as it is read (an upper bound: each tensor is cast to
        # the compute dtype as soon as it is read)
        staged = group * self.storage_bytes // self.dtype_bytes
        if self.streamed:
            held = kept_group + (max(device, group + staged) if self.device_is_host else staged)
            return cache + held
        on_host = weights + kept
        if self.device_is_host:  # the group's weights are the host's, cast when dtypes differ
            shared = staged if self.storage_bytes == self.dtype_bytes else 0
            on_host += device - shared
        return cache + on_host


@dataclass(frozen=True)
class PipelineEstimate:
    """Peak bytes of one pipeline; ``device`` and ``host`` are separate memories."""

    pipeline: str
    device_bytes: int
    host_bytes: int
    cache_bytes: int
    detail: str


@dataclass(frozen=True)
class CompressorCost:
    """What compressing one sequential target costs, besides its weights."""

    hessian_bytes: int  # Hessians alive while the target calibrates
    #: peak while its Linears are compressed in order: the Hessians not yet given up plus
    #: one GPTQ/SparseGPT call's working memory
    compress_bytes: int
    kept_bytes: int  # integer weights kept on the host for the checkpoint


def scaled_bytes(
    value: Any,
    batch: int,
    seq: int,
    traced: tuple[int, int] = (PLAN_BATCH, PLAN_SEQ),
    float_bytes: int | None = None,
) -> int:
    """Bytes of ``value`` at the run's batch and sequence size, from its size at ``traced``
    ``(batch, sequence)`` (see module docstring); floating tensors at ``float_bytes`` per
    element when given (activations in the compute dtype, not the traced one)."""
    traced_batch, traced_seq = traced
    if isinstance(value, torch.Tensor):
        factor = 1.0
        if float_bytes and value.is_floating_point():
            factor = float_bytes / value.element_size()
        for i, dim in enumerate(value.shape):
            if dim == traced_seq:
                factor *= seq / traced_seq
            elif dim == traced_batch and i == 0:
                factor *= batch / traced_batch
        return int(value.numel() * value.element_size() * factor)
    if isinstance(value, dict):
        return sum(scaled_bytes(v, batch, seq, traced, float_bytes) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(scaled_bytes(v, batch, seq, traced, float_bytes) for v in value)
    return 0


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
    traced: tuple[int, int] = (PLAN_BATCH, PLAN_SEQ),
) -> list[PipelineEstimate]:
    """Estimates for every pipeline that can run this model (sequential needs a trace).

    ``invariant`` names the intermediates that are equal for every sample (see
    :mod:`~llmc_trace.plan.invariants`): the caches hold them once. ``traced`` is the
    ``(batch, sequence)`` size the graph's example values were traced at.
    """
    batches = -(-settings.samples // settings.batch_size)
    b, s = settings.batch_size, settings.seq_len
    compute = settings.dtype_bytes
    modules = list(model.modules())
    weights = parameter_bytes(modules, settings.storage_bytes)
    targets = _target_modules(model, partitioned)
    costs = compressor_costs(model, partitioned, settings)
    kept = sum(c.kept_bytes for c in costs)
    kept_one = max((c.kept_bytes for c in costs), default=0)
    working = layer_working_bytes(model.config, b, s, compute)
    text = getattr(model.config, "text_config", None) or model.config
    hidden_state = b * s * getattr(text, "hidden_size", 0) * compute
    logits = b * s * _vocab(model.config) * 4
    estimates = []
    if partitioned is not None:
        estimates.append(
            _sequential(
                model, partitioned, settings, batches, weights, costs, working, invariant, traced
            )
        )
    largest_target = max((parameter_bytes(list(t.modules()), compute) for t in targets), default=0)
    outside = parameter_bytes(modules_outside(model, targets), compute)
    varying, shared = _target_arguments(partitioned, invariant, b, s, traced, compute)
    # every batch's call (hidden states and per-batch arguments); the pass that keeps outputs
    # replaces each call's hidden states as it goes, so one batch's output comes on top
    calls = batches * (hidden_state + varying) + shared + hidden_state
    device = (
        outside
        + largest_target
        + max(
            max((c.hessian_bytes for c in costs), default=0) + working,
            max((c.compress_bytes for c in costs), default=0),
        )
        + 2 * hidden_state
        + varying
        + shared
    )
    estimates.append(
        PipelineEstimate(
            LAYER_SEQUENTIAL,
            device_bytes=device,
            host_bytes=settings.host_bytes(
                device, outside + largest_target, weights, calls, kept, kept_one
            ),
            cache_bytes=calls,
            detail="one target and one batch on the device, with the modules outside the "
            "targets; every batch's call on the host",
        )
    )
    everything = parameter_bytes(modules, compute)
    device = everything + max(
        sum(c.hessian_bytes for c in costs) + working + logits, compressing(costs)
    )
    estimates.append(
        PipelineEstimate(
            BASIC,
            device_bytes=device,
            host_bytes=settings.host_bytes(device, everything, weights, 0, kept, kept),
            cache_bytes=0,
            detail="the whole model and every compressor's state on the device at once "
            "(streamed or not, it reads every weight before it starts)",
        )
    )
    device = max(largest_target, outside)
    estimates.append(
        PipelineEstimate(
            DATA_FREE,
            device_bytes=device,
            host_bytes=settings.host_bytes(device, device, weights, 0, kept, kept_one),
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
    costs: list[CompressorCost],
    working: int,
    invariant: set[str],
    traced: tuple[int, int],
) -> PipelineEstimate:
    """Walk the subgraphs as the cache stores their values: an output that has the shape of
    an input the same subgraph consumes takes that input's slab over row by row; any other
    output needs a slab of its own while the consumed inputs' slabs are still held."""
    b, s = settings.batch_size, settings.seq_len
    compute = settings.dtype_bytes

    def size(value: Any) -> int:
        return scaled_bytes(value, b, s, traced, compute)

    values = {n.name: n.meta.get("val") for n in partitioned.trace.graph.nodes}
    cost_of = dict(zip(partitioned.trace.leaves.targets, costs))
    live = {  # the batches' model inputs are cached from the start
        n.name: size(values.get(n.name)) * batches
        for n in partitioned.trace.graph.nodes
        if n.op == "placeholder" and any(n.name in sg.input_names for sg in partitioned.subgraphs)
    }
    peak_cache = peak_device = peak_host = 0
    for subgraph in partitioned.subgraphs:
        group = parameter_bytes(subgraph.submodules(model), compute)
        mine = [cost_of[t] for t in subgraph.targets if t in cost_of]
        calibrating = sum(c.hessian_bytes for c in mine) + (working if subgraph.targets else 0)
        io = sum(size(values.get(n)) for n in subgraph.input_names + subgraph.output_names)
        device = group + io + max(calibrating, compressing(mine))
        peak_device = max(peak_device, device)
        donors = [_signature(values.get(n)) for n in subgraph.consumed_names if n in live]
        before = sum(live.values())
        added = 0
        for name in subgraph.output_names:
            per_batch = size(values.get(name))
            live[name] = per_batch if name in invariant else per_batch * batches
            signature = _signature(values.get(name))
            if name not in invariant and signature is not None and signature in donors:
                donors.remove(signature)  # written into the consumed input's rows
            else:
                added += live[name]
        peak_cache = max(peak_cache, before + added)
        kept_here = sum(c.kept_bytes for c in mine)
        peak_host = max(
            peak_host,
            settings.host_bytes(device, group, weights, before + added, 0, kept_here),
        )
        for name in subgraph.consumed_names:
            live.pop(name, None)
    if not settings.streamed:  # in memory, every compressed layer's integers stay to the end
        peak_host += sum(c.kept_bytes for c in costs)
    return PipelineEstimate(
        SEQUENTIAL,
        device_bytes=peak_device,
        host_bytes=peak_host,
        cache_bytes=peak_cache,
        detail="one subgraph on the device; cross-subgraph values of every batch on the host",
    )


def compressing(costs: list[CompressorCost]) -> int:
    """Peak compressor state while ``costs``' targets are compressed one after another, the
    Hessians of those not yet compressed still held (an upper bound: those already done are
    freed)."""
    total = sum(c.hessian_bytes for c in costs)
    return max((total - c.hessian_bytes + c.compress_bytes for c in costs), default=0)


def _signature(value: Any) -> tuple[Any, ...] | None:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None


def _target_arguments(
    partitioned: PartitionedTrace | None,
    invariant: set[str],
    batch: int,
    seq: int,
    traced: tuple[int, int],
    float_bytes: int,
) -> tuple[int, int]:
    """Bytes of a target's arguments besides the hidden states (mask, rotary tables):
    ``(per batch, once)``, as layer_sequential stores them (shared when equal for all)."""
    if partitioned is None or not partitioned.trace.target_nodes:
        return 0, 0
    first = partitioned.trace.target_nodes[0]
    varying = shared = 0
    for node in first.all_input_nodes[1:]:
        size = scaled_bytes(node.meta.get("val"), batch, seq, traced, float_bytes)
        if node.name in invariant:
            shared += size
        else:
            varying += size
    return varying, shared


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


def _vocab(config: PretrainedConfig) -> int:
    text = getattr(config, "text_config", None) or config
    return getattr(text, "vocab_size", 0) or 0
