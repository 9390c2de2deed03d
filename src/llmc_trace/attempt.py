"""``attempt_trace``: trace a model from its config, partition it, and prove the partition.

The full-size model is traced on ``meta`` (so a 405B config costs no memory) to give the
subgraphs and their memory figures; its tiny twin is traced the same way and replayed against
its own eager forward. The report says where the two traces differ, because then the proof
does not carry over.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from llmc_trace.diagnose.failure import TraceFailure, failure_from_exception
from llmc_trace.diagnose.fixes import Fix, candidate_fixes
from llmc_trace.errors import BadInputError, LlmcTraceError
from llmc_trace.plan.estimate import parameter_bytes
from llmc_trace.graph.partition import PartitionedTrace, partition_trace
from llmc_trace.graph.structure import compare_structure
from llmc_trace.graph.subgraph import Subgraph
from llmc_trace.graph.verify import Verification, verify_subgraphs
from llmc_trace.models.build import build_meta_model, build_twin, load_pretrained
from llmc_trace.models.samples import SampleOptions, make_sample, supported_modalities
from llmc_trace.models.source import ModelSource, resolve_model
from llmc_trace.report import FixAttempt, StructureCheck, SubgraphSummary, TraceReport
from llmc_trace.tracing.targets import LeafPlan, plan_leaves, split_ignore
from llmc_trace.tracing.trace import TraceResult, concrete_arguments, trace_graph

#: ``progress(stage, done, total)``: library code reports, only the CLI draws.
Progress = Callable[[str, int, int], None]
#: Fixes applied one after another before giving up (each round fixes one failure).
MAX_FIX_ROUNDS = 4


def trace_subgraphs(
    model: torch.nn.Module,
    sample_input: dict[str, Any],
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int = 1,
) -> list[Subgraph]:
    """Trace ``model`` on ``sample_input`` and cut it into subgraphs, one target group each.

    Same contract as llm-compressor's ``trace_subgraphs``: executing the subgraphs in order is
    equivalent to executing the model. ``ignore=None`` means llmc-trace's defaults.
    """
    if targets_per_subgraph < 1:
        raise ValueError(f"targets_per_subgraph must be at least 1, got {targets_per_subgraph}")
    trace = trace_graph(model, sample_input, sequential_targets, ignore)
    return partition_trace(trace, targets_per_subgraph).subgraphs


def value_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(value_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(value_bytes(v) for v in value)
    return 0


def summarize(model: torch.nn.Module, partitioned: PartitionedTrace) -> list[SubgraphSummary]:
    values = {node.name: node.meta.get("val") for node in partitioned.trace.graph.nodes}
    summaries = []
    for subgraph in partitioned.subgraphs:
        summaries.append(
            SubgraphSummary(
                index=subgraph.index,
                targets=subgraph.targets,
                num_nodes=subgraph.num_nodes,
                input_names=subgraph.input_names,
                output_names=subgraph.output_names,
                consumed_names=subgraph.consumed_names,
                output_bytes=sum(value_bytes(values.get(n)) for n in subgraph.output_names),
                parameter_bytes=parameter_bytes(subgraph.submodules(model)),
            )
        )
    return summaries


def attempt_trace(
    model: str | ModelSource,
    *,
    modality: str = "text",
    sequential_targets: list[str] | None = None,
    ignore: list[str] | None = None,
    targets_per_subgraph: int = 1,
    seq_len: int = 32,
    image_size: int | None = None,
    verify: bool = True,
    real_weights: bool = False,
    fix: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
) -> TraceReport:
    """Trace, partition and verify ``model``; never raises for an untraceable model.

    Bad input (unknown model, unsupported modality, targets that match nothing) raises
    :class:`~llmc_trace.errors.BadInputError` before any tracing. An untraceable model gives a
    report with ``failure`` set. ``real_weights`` verifies on the folder's weights instead of
    the twin (the folder must hold safetensors). ``fix`` searches for fixes when tracing
    fails (see :mod:`~llmc_trace.diagnose.fixes`); the report lists every fix tried and
    ``applied_fix`` holds the working configuration.

    >>> report = attempt_trace("meta-llama/Llama-3.1-8B-Instruct")   # doctest: +SKIP
    >>> report.ok, len(report.subgraphs)                              # doctest: +SKIP
    (True, 33)
    """
    if targets_per_subgraph < 1:
        raise BadInputError(
            f"targets_per_subgraph must be at least 1, got {targets_per_subgraph}.",
            hint="Use 1 for one decoder layer per subgraph.",
            param="targets_per_subgraph",
        )
    source = model if isinstance(model, ModelSource) else resolve_model(model)
    if real_weights and not source.has_weights:
        raise BadInputError(
            f"{source.name} has no weights to verify on.",
            hint="Drop --real-weights, or point --model at a folder with *.safetensors.",
            param="real_weights",
        )
    options = SampleOptions(seq_len=seq_len, image_size=image_size, seed=seed)
    report_progress = progress or (lambda stage, done, total: None)

    def run(extra_ignore: list[str]) -> tuple[TraceReport, _Attempt]:
        step = _Attempt(
            source,
            modality,
            sequential_targets,
            [*(ignore or []), *extra_ignore],
            targets_per_subgraph,
            options,
            report_progress,
        )
        return step.run(verify, real_weights), step

    report, step = run([])
    if fix and not report.ok and report.failure is not None:
        report = search_fixes(report, step, run)
    return report


def search_fixes(
    report: TraceReport, step: _Attempt, run: Callable[[list[str]], tuple[TraceReport, _Attempt]]
) -> TraceReport:
    """Try fixes round by round; keep a fix that verifies or moves the failure further on.

    A candidate that cannot apply (autowrap refusing a statement that returns, say) is
    reported with its reason and costs no trace.
    """
    applied: list[Fix] = []
    tried: list[FixAttempt] = []
    for _ in range(MAX_FIX_ROUNDS):
        failure = report.failure
        if report.ok or failure is None or step.leaves is None:
            break
        accepted = False
        for fix in candidate_fixes(failure, step.model):
            rewrites = [fix.rewrite] if fix.rewrite else []
            refusal = fix.refusal
            if not refusal:
                names = [n for f in applied for n in f.ignore] + list(fix.ignore)
                try:
                    trial, trial_step = run(names)
                except BadInputError as err:  # the fix's own entry cannot be installed
                    refusal = err.message
            if refusal:
                tried.append(
                    FixAttempt(fix.description, list(fix.ignore), "refused", "", refusal, rewrites)
                )
                continue
            moved_on = trial.failure is not None and trial.failure.location != failure.location
            outcome = (
                "verified"
                if trial.ok
                else "fails further on"
                if moved_on
                else "still fails"
                if trial.failure
                else "verification failed"
            )
            tried.append(
                FixAttempt(
                    fix.description,
                    list(fix.ignore),
                    outcome,
                    fix.cost,
                    trial.failure.exception if trial.failure else "",
                    rewrites,
                )
            )
            if trial.ok or moved_on:
                applied.append(fix)
                report, step, accepted = trial, trial_step, True
                break
        if not accepted:
            break
    combined = None
    if applied and report.ok:
        combined = FixAttempt(
            "; ".join(f.description for f in applied),
            [n for f in applied for n in f.ignore],
            "verified",
            "; ".join(f.cost for f in applied if f.cost),
            rewrites=[f.rewrite for f in applied if f.rewrite],
        )
    return dataclasses.replace(report, fixes=tried, applied_fix=combined)


class _Attempt:
    """The steps of one attempt, sharing their inputs (kept out of the public API)."""

    def __init__(
        self,
        source: ModelSource,
        modality: str,
        targets: list[str] | None,
        ignore: list[str] | None,
        tps: int,
        options: SampleOptions,
        progress: Progress,
    ) -> None:
        self.source, self.modality, self.targets, self.ignore = source, modality, targets, ignore
        self.tps, self.options, self.progress = tps, options, progress
        self.timings: dict[str, float] = {}
        self.model: torch.nn.Module | None = None
        self.leaves: LeafPlan | None = None

    def run(self, verify: bool, real_weights: bool) -> TraceReport:
        config = self.source.config()
        if self.modality not in supported_modalities(config):
            make_sample(config, self.modality, self.options)  # raises the explanatory error
        self.progress("build", 0, 4)
        full = self._timed("build_s", lambda: build_meta_model(self.source))
        self.model = full
        self.leaves = plan_leaves(
            full, self.targets, split_ignore(full, list(self.ignore or []))[0]
        )
        sample = make_sample(full.config, self.modality, self.options)
        self.progress("trace", 1, 4)
        traced, failure = self._trace(full, sample, "trace_s")
        if failure is not None or traced is None:
            return self._report(full, None, failure=failure)
        partitioned = self._timed("partition_s", lambda: partition_trace(traced, self.tps))
        if not verify:
            return self._report(full, partitioned)
        self.progress("verify", 2, 4)
        verification, structure, verified_on = self._verify(partitioned, real_weights)
        self.progress("done", 4, 4)
        return self._report(full, partitioned, verification, structure, verified_on)

    def _timed(self, key: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - start

    def _trace(
        self, model: torch.nn.Module, sample: dict[str, Any], key: str
    ) -> tuple[TraceResult | None, TraceFailure | None]:
        start = time.perf_counter()
        try:
            return trace_graph(model, sample, self.targets, self.ignore), None
        except LlmcTraceError:
            raise
        except Exception as err:  # every other exception is a finding about the model
            return None, failure_from_exception(err)
        finally:
            self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - start

    def _verify(
        self, full: PartitionedTrace, real_weights: bool
    ) -> tuple[Verification, StructureCheck | None, str]:
        if real_weights:
            model = self._timed("load_s", lambda: load_pretrained(self.source))
            verified_on = "real weights"
        else:
            model = self._timed(
                "twin_s",
                lambda: build_twin(
                    self.source, seed=self.options.seed, min_layers=max(2, 2 * self.tps)
                ),
            )
            verified_on = "tiny twin"
        sample = make_sample(model.config, self.modality, self.options)
        traced, failure = self._trace(model, sample, "twin_trace_s")
        if traced is None:
            reason = failure.exception if failure else "unknown"
            problem = f"the {verified_on} did not trace although the full model did: {reason}"
            return Verification(False, 0.0, [], [problem]), None, verified_on
        partitioned = partition_trace(traced, self.tps)
        self.progress("verify", 3, 4)
        verification = self._timed(
            "verify_s",
            lambda: verify_subgraphs(
                model,
                partitioned.subgraphs,
                sample,
                traced.input_names,
                self.tps,
                eager_kwargs=_eager_kwargs(model),
            ),
        )
        structure = (
            None if real_weights else compare_structure(full.subgraphs, partitioned.subgraphs)
        )
        return verification, structure, verified_on

    def _report(
        self,
        model: torch.nn.Module,
        partitioned: PartitionedTrace | None,
        verification: Verification | None = None,
        structure: StructureCheck | None = None,
        verified_on: str = "",
        failure: TraceFailure | None = None,
    ) -> TraceReport:
        trace = partitioned.trace if partitioned else None
        leaves: dict[str, int] = {}
        if trace is not None:
            for reason in trace.leaf_reasons.values():
                leaves[reason] = leaves.get(reason, 0) + 1
        return TraceReport(
            model=self.source.name,
            architecture=type(model).__name__,
            modality=self.modality,
            sequential_targets=list(trace.leaves.targets) if trace else list(self.targets or []),
            ignore=list(self.ignore or []),
            targets_per_subgraph=self.tps,
            traced=trace is not None,
            subgraphs=summarize(model, partitioned) if partitioned else [],
            timings_s=dict(self.timings),
            verification=verification,
            verified_on=verified_on,
            structure=structure,
            failure=failure,
            guards=[g.describe() for g in trace.guards] if trace else [],
            opaque_functions=list(trace.opaque_recorded) if trace else [],
            leaves=dict(sorted(leaves.items())),
            requested_targets=list(self.targets or []),
        )


def _eager_kwargs(model: torch.nn.Module) -> dict[str, Any]:
    return concrete_arguments(model, {})
