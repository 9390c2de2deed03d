"""llm-compressor's sequential helpers and intermediates cache, over llmc-trace's own.

For code written against llm-compressor: change the imports and it runs on llmc-trace's
tracer, partition and cache. The names, parameters and return types mirror llm-compressor
0.14's ``llmcompressor.pipelines.sequential.helpers`` (:func:`trace_subgraphs`,
:class:`Subgraph`, :func:`get_sequential_ancestors`, :func:`populate_concrete_args`,
:func:`find_target_nodes`, :func:`topological_partition`, :func:`partition_graph`,
:func:`trace_consumed_names`, :func:`graph_is_well_formed`) and
``llmcompressor.pipelines.cache.IntermediatesCache``; each is a thin adapter::

    from llmc_trace.compat import IntermediatesCache, trace_subgraphs

    subgraphs = trace_subgraphs(model, sample, ["LlamaDecoderLayer"], ignore=[])
    cache = IntermediatesCache.from_dataloader(batches, model_device="cpu")
    for subgraph in subgraphs:
        for batch_index in range(len(cache)):
            inputs = cache.fetch(batch_index, subgraph.input_names)
            outputs = subgraph.forward(model, **inputs)
            cache.update(batch_index, outputs)
            cache.delete(batch_index, subgraph.consumed_names)

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
  llm-compressor's default list names functions of many models.
* **Errors** are :class:`~llmc_trace.errors.BadInputError` (a ``ValueError``) with a hint:
  a partition of a graph that is not well formed (llm-compressor asserts), deleting a name
  a batch does not hold (there a ``KeyError``), a ``forward`` parameter with no default that
  the sample lacks (there it became a concrete ``inspect.Parameter.empty``).
* **graph_is_well_formed** also runs torch.fx's ``Graph.lint``: a node used before it is
  defined, or reading a node of another graph, is refused too.
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
