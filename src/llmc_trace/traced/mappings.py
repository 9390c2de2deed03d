"""Find a model's smooth -> balance pairs and prove each one on its tiny twin.

The pairs are read (:mod:`llmc_trace.graph.mappings`) from a trace in which every linear
layer is a call of its own, so they follow the model's own code, whatever its architecture: no
table of module names to keep up to date, none to fall back on. The graph can only say that a
scale *should* pass; the proof says it does: on the tiny twin (the same code at small sizes,
seeded weights) each pair gets a scale drawn in [0.5, 2] per channel folded in
(:func:`~llmc_trace.algorithms.smoothing.fold_scales`), and the model's output must stay what
it was. A pair of the model whose twin counterpart (the same module names up to layer
numbers) failed, or has none, is skipped with the reason, never smoothed.

Fused experts are seen as their projections (:func:`~llmc_trace.moe.observe.observe_experts`)
while the pairs are read and proved, and the experts modules stay single calls in the trace
(the experts a token reaches are a data-dependent loop): a mixture's norm reaches its router
and every expert's gate and up projection, and each expert's up projection its down
projection (:mod:`llmc_trace.moe.pairs`). The router is not quantized, but reads the norm's
channels as the experts do: the scales are folded into it too, so the routing stays the same.

The trace into the layers reads code the layer trace keeps inside one call; where it stops,
the fixes ``attempt --fix`` would try are searched (:func:`linear_trace`), and the linear
layers a fix records inside one call are named in the result (``unreached``), never smoothed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from llmc_trace.algorithms.smoothing import fold_scales, norm_offset
from llmc_trace.diagnose.failure import TraceFailure, failure_from_exception
from llmc_trace.diagnose.search import search_fixes
from llmc_trace.errors import TraceStopped
from llmc_trace.graph.mappings import Mapping, SkippedMapping, derive_mappings
from llmc_trace.layers.linear import is_linear
from llmc_trace.models.samples import SampleOptions
from llmc_trace.models.source import ModelSource
from llmc_trace.moe import fused_experts, observe_experts
from llmc_trace.tracing.options import TracingOptions
from llmc_trace.tracing.settings import TracingSettings, tracing_settings
from llmc_trace.tracing.trace import TraceResult, trace_graph

#: failures the trace into the layers fixes one after another: it reads more code than the
#: layer trace (each attention, mixer and expert kind), whose search stops at
#: :data:`~llmc_trace.diagnose.search.MAX_FIX_ROUNDS`
LINEAR_FIX_ROUNDS = 8

#: largest change of the twin's output, relative to its largest value, a proved fold may make
#: (float32 rounding of a scale folded twice is ~1e-6; a pair that does not commute, ~1)
PROOF_TOLERANCE = 1e-3


@dataclass(frozen=True)
class MappingSet:
    """The pairs to smooth, the pairs left out (and why), and each smooth norm's offset."""

    mappings: list[Mapping]
    skipped: list[SkippedMapping]
    #: per norm class: what it adds to its weight (``1.0`` for Gemma's ``1 + w``)
    offsets: dict[str, float] = field(default_factory=dict)
    #: the ``tracing_ignore`` entries the trace into the layers needed (see :func:`linear_trace`)
    fix: tuple[str, ...] = ()
    #: targeted linear layers that fix runs inside one recorded call: no pair can reach them
    unreached: tuple[str, ...] = ()

    def offset(self, module: torch.nn.Module) -> float:
        return self.offsets.get(type(module).__name__, 0.0)

    def skipped_lines(self) -> list[str]:
        """One line per kind of pair left out: the same pair of every layer is said once,
        with how many more layers have it."""
        kinds: dict[str, list[SkippedMapping]] = {}
        for pair in self.skipped:
            kinds.setdefault(numberless(pair.smooth) + numberless(pair.reason), []).append(pair)
        lines = []
        for pairs in kinds.values():
            first = pairs[0]
            more = f"; {len(pairs) - 1} more like it" if len(pairs) > 1 else ""
            lines.append(
                f"not smoothed: {first.smooth} -> {', '.join(first.balance)} ({first.reason}{more})"
            )
        if self.unreached:
            more = f" and {len(self.unreached) - 1} more" if len(self.unreached) > 1 else ""
            by = f" ({', '.join(self.fix)})" if self.fix else ""
            lines.append(
                f"not examined: {self.unreached[0]}{more} (run inside one recorded call{by}: "
                "quantized, never smoothed)"
            )
        return lines


@dataclass(frozen=True)
class LinearTrace:
    """A trace into every linear layer (:func:`linear_trace`), and the ``tracing_ignore``
    entries the fix search added to get through the layers (empty when none was needed)."""

    result: TraceResult
    fix: tuple[str, ...] = ()

    def unreached(self, is_target: Callable[[str, torch.nn.Module], bool]) -> tuple[str, ...]:
        """The linear layers ``is_target`` takes that the trace did not reach: run inside a
        recorded call (the graph shows no pair into or out of them), or not run at all by
        this sample (a vision tower on text); :func:`find_mappings` tells them apart."""
        reached = {node.target for node in self.result.target_nodes}
        model = self.result.model
        return tuple(
            path
            for path in self.result.leaves.targets
            if path not in reached and is_target(path, model.get_submodule(path))
        )


@dataclass(frozen=True)
class _LinearTrial:
    """One trace into the layers, or where it stopped: a trial of the fix search
    (:class:`~llmc_trace.diagnose.search.Trial`)."""

    result: TraceResult | None
    stopped: TraceStopped | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None

    @cached_property
    def failure(self) -> TraceFailure | None:
        return None if self.stopped is None else failure_from_exception(self.stopped)


def linear_trace(
    model: torch.nn.Module, sample: dict[str, Any], options: TracingOptions
) -> LinearTrace:
    """A trace of ``model(**sample)`` with every linear layer a sequential target, so each is
    its own call (``options`` lend their fixes: ignored modules, opaque calls, autowraps),
    and every fused experts module one call too.

    The trace walks through attention, so it runs with eager attention: the same channels
    reach ``o_proj`` as through a fused kernel (``probs @ v``), and the fused kernels'
    wrappers ask questions of the inputs' sizes that a trace cannot answer.

    Walking into the layers meets code the layer trace never reads (a linear attention's
    kernel, an experts loop, a shape check): where it stops, the fixes ``attempt --fix``
    would try are searched (:func:`~llmc_trace.diagnose.search.search_fixes`), and a fix that
    lets the trace through is kept. A fix may hide linear layers inside one recorded call:
    those show no pairs, the others do. No fix can make a wrong pair: every pair is proved
    by folding scales into the eager twin (:func:`prove`). Raises
    :class:`~llmc_trace.errors.TraceStopped` where no fix gets through."""
    classes = sorted(
        {type(m).__name__ for m in model.modules() if is_linear(m)}
        | {type(m).__name__ for _, m in fused_experts(model)}
    )
    linear = dataclasses.replace(options, sequential_targets=tuple(classes))

    def attempt(entries: list[str]) -> _LinearTrial:
        try:
            tried = linear.with_tracing_ignore(model, entries) if entries else linear
            return _LinearTrial(trace_graph(model, sample, tried, hidden_targets=True))
        except TraceStopped as stopped:
            return _LinearTrial(None, stopped)

    with _eager_attention(model):
        first = attempt([])
        found = (
            search_fixes(first, model, attempt, rounds=LINEAR_FIX_ROUNDS) if first.stopped else None
        )
    last = found.result if found else first
    if last.result is None:
        assert last.stopped is not None, "a trial holds a trace or where it stopped"
        raise last.stopped
    fix = found.applied.tracing_ignore if found and found.applied else []
    return LinearTrace(last.result, tuple(fix))


@contextmanager
def _eager_attention(model: torch.nn.Module) -> Iterator[None]:
    """Every config of ``model`` (a multimodal model's sub-configs too) set to eager
    attention while the block runs, as it was afterwards."""
    configs = [m.config for m in model.modules() if hasattr(m, "config")]
    key = "_attn_implementation_internal"
    saved = [(config, config.__dict__[key]) for config in configs if key in config.__dict__]
    try:
        for config, _ in saved:
            config.__dict__[key] = "eager"
        yield
    finally:
        for config, value in saved:
            config.__dict__[key] = value


def derive(
    model: torch.nn.Module,
    sample: dict[str, Any],
    options: TracingOptions,
    is_target: Callable[[str, torch.nn.Module], bool],
) -> tuple[list[Mapping], list[SkippedMapping], LinearTrace]:
    """The pairs the graph of ``model`` shows (unproved), and the trace they were read from."""
    with observe_experts(model):
        trace = linear_trace(model, sample, options)
        found, skipped = derive_mappings(trace.result.graph, model, is_linear, is_target)
        return found, skipped, trace


def find_mappings(
    model: torch.nn.Module,
    sample: dict[str, Any],
    twin: torch.nn.Module,
    twin_sample: dict[str, Any],
    options: TracingOptions,
    is_target: Callable[[str, torch.nn.Module], bool],
) -> MappingSet:
    """``model``'s pairs, each proved on ``twin`` (see the module docstring); ``is_target``
    is asked of the model's modules and the twin's, with the experts of both observed."""
    with observe_experts(model):
        found, skipped, trace = derive(model, sample, options, is_target)
        proof = prove(twin, twin_sample, options, is_target)
        # of the layers the trace did not reach, those that run (on the twin, on a sample of
        # the same modality) run inside a recorded call; the others this input never runs
        unreached = tuple(p for p in trace.unreached(is_target) if numberless(p) in proof.called)
    kept: list[Mapping] = []
    for mapping in found:
        shape = _shape(mapping)
        if shape in proof.proved:
            kept.append(mapping)
            continue
        reason = proof.failed.get(shape, "the twin has no such pair to prove it on")
        skipped.append(SkippedMapping(mapping.smooth, mapping.balance, reason))
    return MappingSet(kept, skipped, proof.offsets, trace.fix, unreached)


@dataclass(frozen=True)
class Proof:
    """What folding scales into the twin's pairs showed (:func:`prove`)."""

    #: the shapes (:func:`_shape`) of the pairs whose fold kept the output
    proved: set[tuple[Any, ...]]
    #: the shapes of the pairs whose fold changed it, with by how much
    failed: dict[tuple[Any, ...], str]
    #: per smooth norm class, what it adds to its weight
    offsets: dict[str, float]
    #: the linear layers the twin's forward ran, their layer numbers dropped (:func:`numberless`)
    called: frozenset[str]


def prove(
    twin: torch.nn.Module,
    sample: dict[str, Any],
    options: TracingOptions,
    is_target: Callable[[str, torch.nn.Module], bool],
) -> Proof:
    """Fold scales into ``twin``'s pairs (:func:`fold_changes`): into all of them at once
    first, one forward for a model whose pairs all hold, then, where the output changed, into
    each in turn."""
    with observe_experts(twin):
        return _prove(twin, sample, options, is_target)


def _prove(
    twin: torch.nn.Module,
    sample: dict[str, Any],
    options: TracingOptions,
    is_target: Callable[[str, torch.nn.Module], bool],
) -> Proof:
    found, _, _ = derive(twin, sample, options, is_target)
    offsets: dict[str, float] = {}
    proved: set[tuple[Any, ...]] = set()
    failed: dict[tuple[Any, ...], str] = {}
    with torch.no_grad(), _calls_of_linears(twin) as called:
        expected = _output(twin, sample)
    folds = []
    for mapping in found:
        smooth = twin.get_submodule(mapping.smooth)
        offset = 0.0
        if not is_linear(smooth):
            offset = offsets.setdefault(type(smooth).__name__, norm_offset(smooth))
        folds.append((mapping, offset))
    if folds and _changes(twin, sample, folds, seed=0, expected=expected) <= PROOF_TOLERANCE:
        return Proof({_shape(mapping) for mapping in found}, failed, offsets, frozenset(called))
    for number, (mapping, offset) in enumerate(folds):
        change = fold_changes(twin, sample, mapping, offset, seed=number, expected=expected)
        if change <= PROOF_TOLERANCE:
            proved.add(_shape(mapping))
        else:
            failed[_shape(mapping)] = (
                f"folding a scale into it on the twin changed the output by {change:.1e} "
                "of its largest value"
            )
    return Proof(proved, failed, offsets, frozenset(called))


@contextmanager
def _calls_of_linears(model: torch.nn.Module) -> Iterator[set[str]]:
    """The set, filled while the block runs, of ``model``'s linear layers called (their paths
    without layer numbers)."""
    called: set[str] = set()

    def recorder(path: str) -> Callable[..., None]:
        return lambda *_: called.add(path)

    handles = [
        module.register_forward_pre_hook(recorder(numberless(path)))
        for path, module in model.named_modules()
        if is_linear(module)
    ]
    try:
        yield called
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def fold_changes(
    model: torch.nn.Module,
    sample: dict[str, Any],
    mapping: Mapping,
    offset: float = 0.0,
    *,
    seed: int = 0,
    expected: torch.Tensor | None = None,
) -> float:
    """How much folding scales drawn in [0.5, 2] into ``mapping`` changes ``model``'s output,
    relative to its largest value (0 up to rounding for a true pair); the weights are as they
    were afterwards."""
    if expected is None:
        expected = _output(model, sample)
    return _changes(model, sample, [(mapping, offset)], seed=seed, expected=expected)


@torch.no_grad()
def _changes(
    model: torch.nn.Module,
    sample: dict[str, Any],
    folds: list[tuple[Mapping, float]],
    *,
    seed: int,
    expected: torch.Tensor,
) -> float:
    """The output's change with scales folded into every ``(mapping, offset)`` of ``folds``
    together (folds of true pairs compose: each keeps the function); weights restored."""
    modules = {
        id(module): module
        for mapping, _ in folds
        for module in map(model.get_submodule, (mapping.smooth, *mapping.readers))
    }
    saved = _saved(tuple(modules.values()))
    generator = torch.Generator().manual_seed(seed)
    try:
        for mapping, offset in folds:
            smooth = model.get_submodule(mapping.smooth)
            lo, hi = mapping.rows or (0, _width(smooth))
            scales = 0.5 * 4 ** torch.rand(hi - lo, generator=generator)
            readers = [model.get_submodule(name) for name in mapping.readers]
            fold_scales(smooth, readers, scales, rows=mapping.rows, offset=offset)
        return _relative_change(_output(model, sample), expected)
    finally:
        for module, name, tensor in saved:
            getattr(module, name).copy_(tensor)


def _output(model: torch.nn.Module, sample: dict[str, Any]) -> torch.Tensor:
    """The logits, or the output's first value (a spectrogram, a last hidden state): a
    model output indexes its fields that are set, in order. Random draws repeat from one
    forward to the next (SpeechT5's speech prenet drops out in eval mode too), so that only a
    fold can change the output."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        output = model(**sample)
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = output if isinstance(output, torch.Tensor) else output[0]
    return logits.float()


def _relative_change(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = float(expected.abs().max()) or 1.0
    return float((got - expected).abs().max()) / scale


def _saved(modules: tuple[torch.nn.Module, ...]) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """Copies of what a fold writes: each module's weight and bias (a fused expert's weight is
    a fresh view at each read, so they are saved by module and name)."""
    return [
        (module, name, tensor.detach().clone())
        for module in modules
        for name in ("weight", "bias")
        if isinstance(tensor := getattr(module, name, None), torch.Tensor)
    ]


def _width(module: torch.nn.Module) -> int:
    from llmc_trace.layers.linear import as_linear

    layer = as_linear(module)
    return layer.out_features if layer is not None else int(module.weight.shape[0])


def _shape(mapping: Mapping) -> tuple[Any, ...]:
    """A pair with its layer and expert numbers taken out: what carries from the twin (a
    few layers, few experts) to the model."""
    balance = sorted(set(map(numberless, mapping.balance)))
    kept = sorted(set(map(numberless, mapping.kept)))
    return (numberless(mapping.smooth), *balance, "kept:", *kept, mapping.rows is None)


def numberless(path: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".#", path)


def source_mappings(
    model: str | ModelSource,
    *,
    modality: str = "text",
    tracing: TracingSettings | None = None,
    sample_options: SampleOptions | None = None,
    ignore: list[str] | None = None,
) -> MappingSet:
    """The pairs of a model named as the command line names it (built on ``meta`` at full
    size, traced as ``tracing`` says), proved on its twin, for the default scheme's targets
    (every linear layer but ``lm_head``): what ``plan --mappings`` and ``attempt --mappings``
    show. ``ignore`` is the deprecated spelling of ``tracing.tracing_ignore``."""
    settings = tracing_settings(tracing, "source_mappings", {"ignore": ignore})
    from llmc_trace.algorithms.scheme import DEFAULT_SCHEME
    from llmc_trace.models.build import build_meta_model, build_twin
    from llmc_trace.models.source import resolve_model
    from llmc_trace.traced.probe import sample_for

    source = model if isinstance(model, ModelSource) else resolve_model(model)
    options = sample_options or SampleOptions()
    full = build_meta_model(source)
    twin = build_twin(source)
    parsed = TracingOptions.parse(
        full, settings.tracing_ignore, settings.sequential_targets, settings.targets_per_subgraph
    )
    return find_mappings(
        full,
        sample_for(full, modality, options),
        twin,
        sample_for(twin, modality, options),
        parsed,
        DEFAULT_SCHEME.is_target,
    )
