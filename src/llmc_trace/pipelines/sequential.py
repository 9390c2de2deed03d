"""The sequential pipeline: calibrate subgraph by subgraph over the verified partition.

For each subgraph: bring its modules in (:mod:`~llmc_trace.pipelines.residency`: moved to the
device, or read from the checkpoint), run every batch once with the callbacks listening
(calibration), let the callbacks compress, and, with error propagation on, run the batches
again so the next subgraph sees the *compressed* outputs. A subgraph that no callback wants
runs once, with nobody listening, to feed later ones; the last subgraph a callback wants is
not propagated, and the ones after it (the head: norm, ``lm_head``, logits) do not run at
all. Nothing runs that cannot change anything.

Memory: only one subgraph's modules sit on the device at a time (and, streamed, in memory at
all); intermediates wait on the
offload device (see :class:`~llmc_trace.pipelines.cache.IntermediatesCache`). A calibration
pass that a propagation pass will follow keeps no outputs (they would be stale), and the pass
that keeps them drops each batch's consumed inputs as soon as that batch is done, so the cache
holds one set of hidden states plus one batch, never two sets. :func:`estimate_sequential`
sizes exactly that for the memory plan, beside the code it models.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.core.host_memory import release_free_memory
from llmc_trace.core.names import SEQUENTIAL
from llmc_trace.core.progress import Progress, no_progress
from llmc_trace.core.sizes import largest_parameter_bytes, parameter_bytes
from llmc_trace.errors import LlmcTraceError
from llmc_trace.graph.subgraph import MODEL_OUTPUT, Subgraph
from llmc_trace.pipelines.cache import IntermediatesCache, slab_host_bytes
from llmc_trace.pipelines.calibration import Calibration, Pipeline, PipelineStats
from llmc_trace.pipelines.callbacks import Callbacks, NamedModules, named_submodules
from llmc_trace.pipelines.estimate import (
    EstimateInputs,
    PipelineEstimate,
    compressing,
    transient_bytes,
)
from llmc_trace.pipelines.residency import InMemory, Residency
from llmc_trace.pipelines.resume import ResumePoints
from llmc_trace.pipelines.stages import StageComplete, StopWhenSeen, dependency_stages
from llmc_trace.traced.model import TracedModel
from llmc_trace.tracing.guards import check_guards, input_signature
from llmc_trace.tracing.values import forget_example_data


def run_sequential(
    model: torch.nn.Module,
    subgraphs: list[Subgraph],
    batches: list[dict[str, Any]],
    callbacks: Callbacks,
    *,
    device: torch.device | None = None,
    offload_device: torch.device | None = None,
    propagate_error: bool = True,
    true_sequential: bool = False,
    progress: Progress | None = None,
    residency: Residency | None = None,
    resume: ResumePoints | None = None,
) -> PipelineStats:
    """Run ``subgraphs`` over ``batches`` (see the module docstring); returns statistics.

    With ``true_sequential`` (and error propagation), a subgraph's layers are calibrated in
    dependency stages (:mod:`~llmc_trace.pipelines.stages`). ``residency`` says where the
    weights are (default: in memory, moved between ``offload_device`` and ``device``).
    ``resume`` receives the cache after each subgraph that runs, and gives back an
    interrupted run's, whose finished subgraphs are then skipped
    (:mod:`~llmc_trace.pipelines.resume`).
    """
    device = device or torch.device("cpu")
    offload = offload_device or torch.device("cpu")
    report = progress or no_progress
    inputs = [{k: v for k, v in b.items() if k in _graph_inputs(subgraphs)} for b in batches]
    cache = IntermediatesCache.from_batches(inputs, offload, for_gpu=device.type == "cuda")
    release_free_memory()  # what loading and tracing freed would count towards our peak
    stats = PipelineStats()
    residency = residency or InMemory(offload)
    modules_of = [s.submodules(model) for s in subgraphs]
    named_of = [named_submodules(model, modules) for modules in modules_of]
    wanted = [position for position, named in enumerate(named_of) if callbacks.wants(named)]
    last = wanted[-1] if wanted else -1  # later subgraphs can change nothing anybody sees
    if last >= 0:  # the last runs only what is listened to: the head after it stays out
        last_part = _listened_part(model, subgraphs[last], callbacks)
        modules_of[last] = last_part.submodules(model)
        named_of[last] = named_submodules(model, modules_of[last])
    residency.prepare(modules_of[: last + 1])
    finished = resume.start(SEQUENTIAL) if resume is not None else 0
    if finished:
        cache, stats = resume.restore()  # type: ignore[union-attr]
        for modules in modules_of[:finished]:
            residency.skip(modules)
    for position, subgraph in enumerate(subgraphs[: last + 1]):
        if position < finished:
            continue
        label = f"subgraph {position + 1}/{last + 1}"
        if subgraph.targets:
            label += f" · {subgraph.targets[0]}"
        modules, named = modules_of[position], named_of[position]
        residency.enter(modules, device)
        listening = position in wanted
        # When a propagation pass will follow, the calibration pass's outputs would be stale:
        # they are not kept, so the cache never holds two sets of hidden states.
        will_propagate = listening and propagate_error and position < last
        stats.peak_cache_bytes = max(stats.peak_cache_bytes, cache.size_bytes())
        passes = 0
        if listening:
            part = subgraph if position < last else last_part
            staged = true_sequential and propagate_error
            stages = _calibration_passes(model, part, cache, device, named, callbacks, staged)
            for number, stage in enumerate(stages, start=1):
                final = number == len(stages)
                callbacks.on_subgraph_start(subgraph.index, stage)
                _run_all(
                    model,
                    part,
                    cache,
                    device,
                    label if len(stages) == 1 else f"{label} · stage {number}/{len(stages)}",
                    report,
                    batches,
                    callbacks,
                    store=final and position < last and not will_propagate,
                    stop_after=None if final and not will_propagate else stage,
                )
                callbacks.on_calibrated(subgraph.index, stage)
                callbacks.on_subgraph_end(subgraph.index, stage)
                passes += 1
        if not listening or will_propagate:
            suffix = " · propagate" if listening else ""
            _run_all(model, subgraph, cache, device, label + suffix, report)
            passes += 1
        stats.peak_cache_bytes = max(stats.peak_cache_bytes, cache.size_bytes())
        stats.passes.append(passes)
        residency.leave(modules)
        release_free_memory()  # thousands of batch-sized temporaries came and went
        if resume is not None:
            resume.save(position + 1, (cache, stats))
    stats.passes.extend([0] * (len(subgraphs) - last - 1))
    stats.shared_names = sorted(cache.shared_names)
    return stats


def _calibration_passes(
    model: torch.nn.Module,
    subgraph: Subgraph,
    cache: IntermediatesCache,
    device: torch.device,
    named: NamedModules,
    callbacks: Callbacks,
    staged: bool,
) -> list[NamedModules]:
    """The passes that calibrate ``subgraph``: its dependency stages when ``staged`` (else one
    stage of all its modules), each split into as many passes as the callbacks ask."""
    stages = _stages(model, subgraph, cache, device, named, callbacks) if staged else [named]
    return [piece for stage in stages for piece in callbacks.passes(stage)]


def _stages(
    model: torch.nn.Module,
    subgraph: Subgraph,
    cache: IntermediatesCache,
    device: torch.device,
    named: NamedModules,
    callbacks: Callbacks,
) -> list[list[tuple[str, torch.nn.Module]]]:
    """The subgraph's wanted layers in dependency stages, from a dry run on the first batch;
    one stage of all its modules when the layers do not depend on each other."""
    layers = [(name, module) for name, module in named if callbacks.wants([(name, module)])]

    def run_once() -> None:
        values = cache.fetch(0, subgraph.input_names, device, subgraph.mutated_inputs())
        subgraph.forward(model, **values)

    stages = dependency_stages(run_once, layers)
    return stages if len(stages) > 1 else [list(named)]


def _listened_part(model: torch.nn.Module, subgraph: Subgraph, callbacks: Callbacks) -> Subgraph:
    """The last subgraph anybody listens to, without what only its outputs need (the head)."""
    wanted = {
        path
        for path in subgraph.module_paths()
        if callbacks.wants(named_submodules(model, list(model.get_submodule(path).modules())))
    }
    return subgraph.restricted_to(wanted)


def _graph_inputs(subgraphs: list[Subgraph]) -> set[str]:
    produced = {name for s in subgraphs for name in s.output_names}
    return {name for s in subgraphs for name in s.input_names if name not in produced}


def _run_all(
    model: torch.nn.Module,
    subgraph: Subgraph,
    cache: IntermediatesCache,
    device: torch.device,
    label: str,
    report: Progress,
    batches: list[dict[str, Any]] | None = None,
    callbacks: Callbacks | None = None,
    *,
    store: bool = True,
    stop_after: NamedModules | None = None,
) -> None:
    """Run ``subgraph`` on every cached batch; with ``callbacks``, announce each batch first.

    With ``store``, each batch's outputs go into the cache at once (values shared by all
    batches are merged immediately) and the batch's consumed inputs leave it, so the cache
    grows by one batch at most; without, the outputs are dropped (a calibration pass whose
    outputs a propagation pass will recompute).
    """
    private = subgraph.mutated_inputs()
    stop = StopWhenSeen(stop_after) if stop_after is not None and not store else None
    try:
        with torch.no_grad():
            for index in range(len(cache)):
                report(label, index, len(cache))
                if callbacks is not None and batches is not None:
                    callbacks.on_batch(batches[index])
                values = cache.fetch(index, subgraph.input_names, device, private)
                if stop is not None:
                    stop.next_batch()
                try:
                    result = subgraph.forward(model, **values)
                except StageComplete:  # the stage's layers saw this batch; nothing is kept
                    continue
                finally:
                    del values
                if store:
                    result.pop(MODEL_OUTPUT, None)  # logits of every batch would dwarf the cache
                    cache.replace(index, subgraph.consumed_names, result)
                del result
    finally:
        if stop is not None:
            stop.remove()
    report(label, len(cache), len(cache))


def check_batches_fit(traced: TracedModel, batches: list[dict[str, Any]]) -> None:
    """Every batch must make the decisions the trace took from the first (see guards).

    One graph serves all batches in the sequential pipeline; a batch that would take another
    branch is refused here, before any weight changes, rather than silently run wrongly.
    """
    trace = traced.trace
    assert trace is not None
    seen: set[tuple[Any, ...]] = {input_signature(batches[0])}
    for index, batch in enumerate(batches[1:], start=1):
        signature = input_signature(batch)
        if signature in seen:
            continue
        tensors = {k: v for k, v in batch.items() if k in trace.input_names}
        violations = check_guards(trace.graph, traced.model, trace.guards, tensors)
        if violations:
            guard = violations[0].guard
            statement = f" (`{guard.location.code}`)" if guard.location is not None else ""
            raise LlmcTraceError(
                f"calibration batch {index} breaks a decision the trace took from batch 0"
                f"{statement}: {guard.describe()}, got {violations[0].actual!r}.",
                hint="Use batches of equal shape (packed windows, --batch-size 1 with equal "
                "lengths), or --pipeline basic.",
            )
        seen.add(signature)


def _calibrate(run: Calibration) -> PipelineStats:
    """Run a :class:`Calibration` through :func:`run_sequential`, on a trace that holds no
    example data (it would keep full-size tensors alive), every batch checked against it."""
    traced = run.traced
    if traced.partitioned is None:
        reason = traced.failure.exception if traced.failure else "unknown"
        raise RuntimeError(f"the model does not trace: {reason}")
    check_batches_fit(traced, run.batches)
    forget_example_data([traced.partitioned.trace.graph, *(s.graph for s in traced.subgraphs)])
    return run_sequential(
        run.model,
        traced.subgraphs,
        run.batches,
        run.callbacks,
        device=run.device,
        propagate_error=run.propagate_error,
        true_sequential=run.true_sequential,
        progress=run.progress,
        residency=run.residency,
        resume=run.resume,
    )


def estimate_sequential(inputs: EstimateInputs) -> PipelineEstimate | None:
    """Peak memory of :func:`run_sequential` (``None`` without a trace): one subgraph's
    weights, inputs, outputs and compressor state on the device; on the host, the cache.

    Walks the subgraphs as the cache stores their values: an output that has the shape of
    an input the same subgraph consumes takes that input's slab over row by row; any other
    output needs a slab of its own while the consumed inputs' slabs are still held. On a GPU
    host a slab holds its pinned block (:func:`~llmc_trace.pipelines.cache.slab_host_bytes`).

    Stops at the last subgraph holding a target, and counts of that one only what its
    targets need, as the run does: the head's weights and its logits (at 8B, 8 x 2048 tokens
    over 128,256 words, 4 GiB) were once most of the estimate. Per phase
    (``PipelineEstimate.device_phases``): calibrating holds the Hessians, the layer's
    activations and the hooks' float32 copy of the widest input (of 16-bit activations);
    solving, the Hessians not yet given up and one solve's working memory; propagating, the
    activations."""
    model, partitioned, settings = inputs.model, inputs.partitioned, inputs.settings
    if partitioned is None:
        return None
    batches, weights, costs, working = inputs.batches, inputs.weights, inputs.costs, inputs.working
    invariant, size = inputs.invariant, inputs.size
    compute = settings.dtype_bytes
    values = {n.name: n.meta.get("val") for n in partitioned.trace.graph.nodes}
    cost_of = dict(zip(partitioned.trace.leaves.targets, costs))
    gpu = not settings.device_is_host

    def slab(per_batch: int) -> int:  # every batch's value in one slab, pinned on a GPU host
        return slab_host_bytes(per_batch * batches, gpu)

    live = {  # the batches' model inputs are cached from the start
        n.name: slab(size(values.get(n.name)))
        for n in partitioned.trace.graph.nodes
        if n.op == "placeholder" and any(n.name in sg.input_names for sg in partitioned.subgraphs)
    }
    peak_cache = peak_device = peak_host = 0
    phases = {"calibrate": 0, "solve": 0, "propagate": 0}
    tokens = settings.batch_size * settings.seq_len
    # the subgraphs after the last one holding a target never run (see the module docstring):
    # the head's weights and logits are no part of the peak
    ran = [s for s in partitioned.subgraphs if any(t in cost_of for t in s.targets)]
    last = partitioned.subgraphs.index(ran[-1]) if ran else len(partitioned.subgraphs) - 1
    for position, subgraph in enumerate(partitioned.subgraphs[: last + 1]):
        if position == last and ran:  # the run's `_listened_part`: the targets alone
            subgraph = subgraph.restricted_to(set(subgraph.targets))
        modules = subgraph.submodules(model)
        group = parameter_bytes(modules, compute)
        largest = largest_parameter_bytes(modules, compute)
        mine = [cost_of[t] for t in subgraph.targets if t in cost_of]
        forward = (working if subgraph.targets else 0) + transient_bytes(subgraph.graph, size)
        # a float32 run's hooks read the activations as they are: no copy
        hooks = max((tokens * c.widest_input * 4 for c in mine), default=0) if compute != 4 else 0
        calibrating = sum(c.hessian_bytes for c in mine) + forward + hooks
        io = sum(size(values.get(n)) for n in subgraph.input_names + subgraph.output_names)
        phases["calibrate"] = max(phases["calibrate"], group + io + calibrating)
        phases["solve"] = max(phases["solve"], group + io + compressing(mine))
        phases["propagate"] = max(phases["propagate"], group + io + forward)
        device = group + io + max(calibrating, compressing(mine))
        peak_device = max(peak_device, device)
        donors = [_signature(values.get(n)) for n in subgraph.consumed_names if n in live]
        before = sum(live.values())
        added = 0
        for name in subgraph.output_names:
            per_batch = size(values.get(name))
            live[name] = per_batch if name in invariant else slab(per_batch)
            signature = _signature(values.get(name))
            if name not in invariant and signature is not None and signature in donors:
                donors.remove(signature)  # written into the consumed input's rows
            else:
                added += live[name]
        peak_cache = max(peak_cache, before + added)
        kept_here = sum(c.kept_bytes for c in mine)
        peak_host = max(
            peak_host,
            settings.host_bytes(device, group, weights, before + added, 0, kept_here, largest),
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
        device_phases=phases,
    )


def _signature(value: Any) -> tuple[Any, ...] | None:
    return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else None


PIPELINE = Pipeline(SEQUENTIAL, _calibrate, estimate_sequential)
