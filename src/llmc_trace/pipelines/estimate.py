"""What a pipeline's memory estimate reads and returns, and the arithmetic estimates share.

Each pipeline estimates its own peak device and host bytes beside its runner (its
:class:`~llmc_trace.pipelines.calibration.Pipeline` record names both), so an estimate changes
with the code it models. They all read one :class:`EstimateInputs`, which the memory plan
(:mod:`llmc_trace.plan`) fills once: the full-size trace on ``meta``, the run's settings, the
compressor's cost per sequential target, and which intermediates are equal for every sample.

Intermediates are measured at the tracing sample's batch and sequence sizes and scaled to the
run's (:func:`scaled_bytes`: a dimension equal to the tracing sequence length scales with the
run's; the tracing sizes are chosen so they collide with no model width). Values that are the
same for every sample (masks, rotary tables) are counted once, as the caches store them.

Inside a sequential target the graph is opaque and its working memory comes from the config
(:func:`~llmc_trace.plan.estimate.layer_working_bytes`); between targets it is traced, node by
node, so what that code holds while it runs is read off the graph (:func:`transient_bytes`): a
vision tower's patches through its blocks, its attention over them, the merge into the text
embeddings. A vision-language model's first subgraph can need more than a decoder layer.

Where the weights are follows :mod:`~llmc_trace.pipelines.residency`: in memory, the host
holds every weight in the checkpoint's dtype and the device one group in the compute dtype;
streamed, tensors are read and written one at a time, so the host holds one tensor in transit
(where it is cast or crosses to or from the device) and nothing after. On a CPU run the device
*is* the host, so the host figure includes the device's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from llmc_trace.core.sizes import largest_parameter_bytes, parameter_bytes
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
    #: The attention kernel calibration asks for (``CalibrationSettings.attn_implementation``).
    attention: str = "eager"

    def host_bytes(
        self,
        device: int,
        group: int,
        weights: int,
        cache: int,
        kept: int,
        kept_group: int,
        largest: int = 0,
    ) -> int:
        """Host peak from the device peak and the weights: ``group`` is the largest group's
        parameter count times ``dtype_bytes`` (what the device holds of it), ``weights`` all
        of the model's at ``storage_bytes`` (see the module docstring); ``largest``, the
        group's largest tensor at ``dtype_bytes``."""
        cast = self.storage_bytes != self.dtype_bytes
        if self.streamed:
            # streamed, tensors are read from the checkpoint and written to the new one one at
            # a time (`models/weight_store.py`, `checkpoint/shards.py`): beside the group the
            # host holds one tensor in transit, in the stored dtype, where it is cast (float32
            # compute on a CPU) or crosses from or to the device; on the device's way in, a
            # cast on the host holds its compute-dtype copy too
            moved = cast or not self.device_is_host
            in_transit = largest * self.storage_bytes // self.dtype_bytes if moved else 0
            if self.device_is_host:
                return cache + kept_group + max(device, group + in_transit)
            return cache + kept_group + in_transit + (largest if cast else 0)
        on_host = weights + kept
        if self.device_is_host:  # the group's weights are the host's, cast when dtypes differ
            on_host += device - (0 if cast else group)
        return cache + on_host


@dataclass(frozen=True)
class PipelineEstimate:
    """Peak bytes of one pipeline; ``device`` and ``host`` are separate memories.

    ``device_phases`` splits the device peak by what the run is doing when it is reached,
    where the pipeline's formula tells them apart (the sequential one: ``calibrate``, the
    forwards with the Hessians' hooks; ``solve``, the layers compressed; ``propagate``, the
    forwards on the compressed layers): a measured peak per phase can then be held against
    each term, and ``device_bytes`` is their largest."""

    pipeline: str
    device_bytes: int
    host_bytes: int
    cache_bytes: int
    detail: str
    device_phases: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CompressorCost:
    """What compressing one sequential target costs, besides its weights."""

    hessian_bytes: int  # Hessians alive while the target calibrates
    #: peak while its Linears are compressed in order: the Hessians not yet given up plus
    #: one GPTQ/SparseGPT call's working memory
    compress_bytes: int
    kept_bytes: int  # integer weights kept on the host for the checkpoint
    #: the widest input a Hessian's hook reads: it folds each batch in as a float32 copy,
    #: tokens x this x 4 bytes beside the layer's activations (0 when no Hessian is made)
    widest_input: int = 0


@dataclass(frozen=True)
class EstimateInputs:
    """Everything a pipeline's estimate reads, computed once per plan.

    ``partitioned`` is the full-size trace (``None`` when the model did not trace);
    ``invariant`` names the intermediates equal for every sample; ``traced`` is the ``(batch,
    sequence)`` size the graph's example values were traced at. ``targets`` are the sequential
    targets (every linear layer when untraced), ``costs`` the compressor's per target,
    ``weights`` all of the model's weights at the storage dtype, ``working`` one decoder
    layer's activations (:func:`~llmc_trace.plan.estimate.layer_working_bytes`) and
    ``between`` the most the traced code between targets holds at once (:func:`transient_bytes`
    of the subgraphs without a target).
    """

    model: torch.nn.Module
    partitioned: PartitionedTrace | None
    settings: RunSettings
    invariant: set[str]
    traced: tuple[int, int]
    targets: list[torch.nn.Module]
    costs: list[CompressorCost]
    weights: int
    working: int
    between: int = 0

    @property
    def batches(self) -> int:
        return -(-self.settings.samples // self.settings.batch_size)

    @property
    def working_peak(self) -> int:
        """Activations alive at once in a forward that runs everything: a decoder layer's, or
        the code between the layers' (a vision tower), whichever is more (they run in turn)."""
        return max(self.working, self.between)

    @property
    def kept(self) -> int:
        """Integer weights kept for the whole model."""
        return sum(c.kept_bytes for c in self.costs)

    @property
    def kept_one(self) -> int:
        """Integer weights kept for the largest target."""
        return max((c.kept_bytes for c in self.costs), default=0)

    def largest_target_bytes(self) -> int:
        """The largest target's weights in the compute dtype."""
        compute = self.settings.dtype_bytes
        return max((parameter_bytes(list(t.modules()), compute) for t in self.targets), default=0)

    def largest_tensor_bytes(self) -> int:
        """The model's largest parameter in the compute dtype."""
        return largest_parameter_bytes(list(self.model.modules()), self.settings.dtype_bytes)

    def outside_bytes(self) -> int:
        """The weights outside every target (embeddings, final norm, head), in the compute
        dtype."""
        return parameter_bytes(modules_outside(self.model, self.targets), self.settings.dtype_bytes)

    def size(self, value: Any) -> int:
        """:func:`scaled_bytes` of ``value`` at the run's sizes, activations in the compute
        dtype."""
        settings = self.settings
        return scaled_bytes(
            value, settings.batch_size, settings.seq_len, self.traced, settings.dtype_bytes
        )


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


#: Operations whose result shares an input's storage (or is no tensor): they allocate nothing.
_VIEWS = frozenset(
    {
        "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "expand",
        "narrow", "select", "chunk", "split", "unbind", "t", "getitem", "size", "dim",
        "unflatten", "view_as", "expand_as", "detach", "contiguous",
    }
)  # fmt: skip


def transient_bytes(graph: fx.Graph, size: Callable[[Any], int]) -> int:
    """The most a subgraph's own code holds at once besides its inputs and outputs: each
    computed value (sized by ``size`` from its example value) lives from the node that makes it
    to its last reader. Views are free; a sequential target's inside is not seen here (its
    call's result is, as any other value). An upper bound where an operation works in place."""
    nodes = list(graph.nodes)
    last_read = {used: i for i, node in enumerate(nodes) for used in node.all_input_nodes}
    returned = {n for n in nodes if n.op == "output" for n in n.all_input_nodes}
    alive: dict[fx.Node, int] = {}
    live = peak = 0
    for i, node in enumerate(nodes):
        if node.op.startswith("call_") and node not in returned and _allocates(node):
            alive[node] = size(node.meta.get("val"))
            live += alive[node]
            peak = max(peak, live)
        for used in node.all_input_nodes:
            if last_read[used] == i and used in alive:
                live -= alive.pop(used)
    return peak


def _allocates(node: fx.Node) -> bool:
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return name not in _VIEWS


def compressing(costs: list[CompressorCost]) -> int:
    """Peak compressor state while ``costs``' targets are compressed one after another, the
    Hessians of those not yet compressed still held (an upper bound: those already done are
    freed)."""
    total = sum(c.hessian_bytes for c in costs)
    return max((total - c.hessian_bytes + c.compress_bytes for c in costs), default=0)


def compressing_and_keeping(costs: list[CompressorCost]) -> int:
    """Peak of :func:`compressing` with the integers kept for the checkpoint in the same
    memory (a CPU run): the compressor solves its targets in order, giving each Hessian up
    as it goes, so the integers of the targets done pile up while the Hessians still held
    shrink. Adding all the integers to the Hessians' peak counted, on a CPU, both at their
    largest at once: 1.22x the measured peak of ``basic`` on ``benchmarks/pipeline_memory.py``'s
    16 layers."""
    held = sum(c.hessian_bytes for c in costs)
    kept = peak = 0
    for cost in costs:
        peak = max(peak, held - cost.hessian_bytes + cost.compress_bytes + kept)
        held -= cost.hessian_bytes
        kept += cost.kept_bytes
    return max(peak, kept)
