"""llm-compressor's sequential helpers, pipelines and intermediates cache, over llmc-trace's own.

For code written against llm-compressor: change the imports and it runs on llmc-trace's
tracer, partition, pipelines and cache. The names, parameters and return types mirror
llm-compressor 0.14's ``llmcompressor.pipelines.sequential.helpers`` (:func:`trace_subgraphs`,
:class:`Subgraph`, :func:`get_sequential_ancestors`, :func:`populate_concrete_args`,
:func:`find_target_nodes`, :func:`topological_partition`, :func:`partition_graph`,
:func:`trace_consumed_names`, :func:`graph_is_well_formed`, :class:`SequentialTracer`, and
from its documented API up to 0.10 :func:`dispatch_for_sequential`,
:func:`get_sequential_targets`, :func:`match_modules`), ``llmcompressor.pipelines.cache.IntermediatesCache`` and the
pipelines of ``llmcompressor.pipelines`` (:class:`CalibrationPipeline` with
``from_modifiers``, :class:`SequentialPipeline`, :class:`LayerSequentialPipeline`,
:class:`BasicPipeline`, :class:`DataFreePipeline`, :class:`IndependentPipeline`); each is a
thin adapter::

    from llmc_trace.compat import IntermediatesCache, trace_subgraphs

    subgraphs = trace_subgraphs(model, sample, ["LlamaDecoderLayer"], ignore=[])
    cache = IntermediatesCache.from_dataloader(batches, model_device="cpu")
    for subgraph in subgraphs:
        for batch_index in range(len(cache)):
            inputs = cache.fetch(batch_index, subgraph.input_names)
            outputs = subgraph.forward(model, **inputs)
            cache.update(batch_index, outputs)
            cache.delete(batch_index, subgraph.consumed_names)

or, with a pipeline and a hook-based algorithm of one's own (:mod:`llmc_trace.compat.callbacks`)::

    callbacks = CalibrationCallbacks(sequential_epoch_end=compress)
    for module in match_modules(model, ["Linear"]):
        callbacks.register_hook(module, collect_inputs)
    SequentialPipeline(callbacks)(model, batches, {"sequential_targets": ["LlamaDecoderLayer"]})

Where the behaviour differs, and why:

* **Partitions.** Placeholders and attribute reads belong to no partition (every subgraph
  reads model inputs directly and copies the attributes it uses), and a node goes as early as
  its inputs allow. So when nothing precedes the first target there is no head partition:
  six ``Linear`` targets in a row give six partitions, where llm-compressor gives seven.
* **The last subgraph** returns ``{"output": <model output>}`` (:data:`MODEL_OUTPUT`) like
  every other subgraph returns a dict, where llm-compressor returns the model output itself;
  llm-compressor's pipeline never reads it. A subgraph's ``forward`` takes its inputs by
  keyword and ignores names it does not read.
* **Tracing.** :func:`trace_subgraphs` runs llmc-trace's tracer (located failures, guards,
  opaque mask builders). ``ignore`` names the model does not have are dropped, as
  llm-compressor's default list names functions of many models, with one warning listing
  them (a likely typo with the model's closest name), where llm-compressor says nothing.
* **Errors** are :class:`~llmc_trace.errors.BadInputError` (a ``ValueError``) with a hint:
  a partition of a graph that is not well formed (llm-compressor asserts), deleting a name
  a batch does not hold (there a ``KeyError``), a ``forward`` parameter with no default that
  the sample lacks (there it became a concrete ``inspect.Parameter.empty``).
* **graph_is_well_formed** also runs torch.fx's ``Graph.lint``: a node used before it is
  defined, or reading a node of another graph, is refused too.
* **No session.** llm-compressor's pipelines announce calibration start, each step's end
  and calibration end through its session (``LifecycleCallbacks``) and disable modifier hooks
  (``HooksMixin``) while they propagate. Here a pipeline is built with the
  :class:`CalibrationCallbacks` to tell: ``SequentialPipeline(callbacks)(model, dataloader,
  dataset_args)``, the events ``calibration_epoch_start``, ``sequential_epoch_end(modules)``
  and ``calibration_epoch_end``, and hooks registered through ``callbacks.register_hook``
  (silent while a pipeline traces or propagates). ``from_modifiers`` makes the callbacks among
  the modifiers the pipeline's; ``IndependentPipeline`` runs each callbacks object in turn.
* **Which subgraphs run.** A subgraph whose modules no callbacks object listens to (no hook
  there and no ``sequential_epoch_end``) runs once, unheard, to feed the next; the subgraphs
  after the last one listened to (the head) do not run. With a ``sequential_epoch_end``, every
  subgraph is calibrated, as in llm-compressor.
* **Memory.** Weights wait on the CPU and each step's modules come to the execution device
  (:func:`dispatch_for_sequential`'s, else the first accelerator) for their step; the
  intermediates wait on the CPU, pinned on a GPU host, so ``sequential_offload_device`` other
  than ``"cpu"`` is warned about and ``sequential_prefetch`` has nothing to do. There is no
  out-of-memory handler suggesting smaller targets to try: ``llmc-trace plan`` (or
  :func:`llmc_trace.plan.plan_memory`) sizes each pipeline for a model, its targets and data
  before a run, where llm-compressor leaves it to trial and error.
* **Tracing in the pipeline.** :class:`SequentialPipeline` traces with the first fix that
  verifies when the model does not trace as written (``NotTraceableError``, located, when none
  does); :class:`LayerSequentialPipeline`, :class:`BasicPipeline` and
  :class:`DataFreePipeline` trace nothing. Default targets are llmc-trace's
  (``_no_split_modules`` outside vision and audio towers), where llm-compressor's include a
  vision tower's blocks.
* **Per pipeline.** :class:`BasicPipeline` and :class:`LayerSequentialPipeline` hand
  ``sequential_epoch_end`` the sequential targets' modules (embeddings and head are not
  calibrated), where llm-compressor's basic pipeline hands every module of the model;
  :class:`DataFreePipeline` calls it once per target and once for the rest, where
  llm-compressor calls it once with every module. :class:`LayerSequentialPipeline` (removed
  from llm-compressor in 0.9, documented before) checks on the first batch that each target
  receives the previous one's output unchanged and raises ``RuntimeError`` where it does not.
  Every pipeline runs the model in eval mode and under ``torch.no_grad``.
* **dataset_args** is a ``DatasetArguments``, any object with its attributes, a mapping or
  ``None`` (:func:`pipeline_arguments`); names ``DatasetArguments`` does not have are named
  in one warning.
* **The cache** stores a value equal in every batch once and per-batch tensors in slabs
  (:mod:`llmc_trace.pipelines.cache`). ``fetch`` therefore hands out copies the caller
  owns even where llm-compressor would hand out the cached tensor (model and offload device
  the same). ``offload_device=None`` keeps values on ``model_device`` (or the CPU for a
  cache built without one), rather than on each value's own device. ``iter_prefetch``
  fetches in turn, without a thread. ``batch_intermediates`` holds the stored values
  themselves, not ``IntermediateValue`` records. Not offered: ``pin_memory`` (stored values
  are pinned already on a GPU host), ``size`` (``intermediates.size_bytes()``), the private
  ``_offload_value``/``_onload_value`` and ``OverrideEqMode``.
"""

from __future__ import annotations

from llmc_trace.compat.arguments import PipelineArguments, pipeline_arguments
from llmc_trace.compat.cache import IntermediatesCache
from llmc_trace.compat.callbacks import CalibrationCallbacks
from llmc_trace.compat.dispatch import dispatch_for_sequential
from llmc_trace.compat.helpers import (
    Subgraph,
    find_target_nodes,
    get_sequential_ancestors,
    graph_is_well_formed,
    partition_graph,
    populate_concrete_args,
    topological_partition,
    trace_consumed_names,
    trace_subgraphs,
)
from llmc_trace.compat.pipelines import (
    BasicPipeline,
    CalibrationPipeline,
    DataFreePipeline,
    IndependentPipeline,
    LayerSequentialPipeline,
    SequentialPipeline,
)
from llmc_trace.compat.targets import get_sequential_targets, match_modules
from llmc_trace.compat.tracer import SequentialTracer
from llmc_trace.graph.subgraph import MODEL_OUTPUT

__all__ = [
    "MODEL_OUTPUT",
    "BasicPipeline",
    "CalibrationCallbacks",
    "CalibrationPipeline",
    "DataFreePipeline",
    "IndependentPipeline",
    "IntermediatesCache",
    "LayerSequentialPipeline",
    "PipelineArguments",
    "SequentialPipeline",
    "SequentialTracer",
    "Subgraph",
    "dispatch_for_sequential",
    "find_target_nodes",
    "get_sequential_ancestors",
    "get_sequential_targets",
    "graph_is_well_formed",
    "match_modules",
    "partition_graph",
    "pipeline_arguments",
    "populate_concrete_args",
    "topological_partition",
    "trace_consumed_names",
    "trace_subgraphs",
]
