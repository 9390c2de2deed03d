"""``trace_subgraphs`` on model instances: llmc-trace against llm-compressor 0.14, same run.

llm-compressor users call ``trace_subgraphs(model, sample_input, sequential_targets, ignore)``
with a loaded model and one batch. For every built-in model and every modality llmc-trace
builds samples for, the tiny twin (``build_twin(source, seed=1)``, sdpa attention, eager where
transformers refuses sdpa) and its sample (32 tokens) go to both tools' ``trace_subgraphs``,
with two target settings:

* ``default``: llmc-trace's ``sequential_targets=None`` (its own default, ``ignore=None``);
  llm-compressor's default as its sequential pipeline resolves it,
  ``infer_sequential_targets(model, None)`` (``model._no_split_modules``), with its default
  ignore list ``DatasetArguments().tracing_ignore``;
* ``Linear``: ``["Linear"]`` on both sides (llm-compressor with its default ignore list).

Per case and tool, ``status``: ``ok`` when the call returned subgraphs and replaying them in
order (each fed the values its ``input_names`` name, its outputs kept, its ``consumed_names``
dropped, as a pipeline does) reproduces ``model(**sample, use_cache=False)``: every floating
tensor of the eager output (logits, last_hidden_state, encoder states) present, same shape,
and max |replay - eager| <= 1e-4 x max |eager| (float32 arithmetic in another order, or eager
attention against sdpa, moves ~1e-6 of that); ``wrong`` when it returned subgraphs that do not
(the replay crashed, lacks an output or differs); ``failed`` when the call raised. ``modules``:
whether every submodule call the replay made returned, within the same tolerance, what a call
of that submodule returned in the eager forward (forward hooks on every submodule; the decoder layers,
Linears, norms, towers: what a calibration hook sees), so a replay that computes every layer
right but drops the model output (``wrong``, ``same``) is told apart from one that computes
wrong values (``differ``). Seconds are the ``trace_subgraphs`` call alone (for llmc-trace, a
search for a verified fix included when the model does not trace as written; each tool's first
call also pays one-time imports). A case gets 120 s.

llm-compressor runs in ``benchmarks/.venv-llmc`` (``bash benchmarks/reference_env.sh``), one
process for all cases (``_reference/instance_tracing_llmcompressor.py``; a case that kills it
is recorded as failed and the process restarts after it): each twin is saved with
``save_pretrained`` and loaded there with the class its config names, the same attention and
float32 (where transformers cannot save or reload a twin's shrunk config, the twin itself,
pickled with ``torch.save``: the row says so), the sample passed with ``torch.save``; it replays in the context its pipeline
calibrates in (eager attention among it), but with the lm_head left on its weights. Both sides
judge the replay with the same function. llmc-trace runs in this process, on a fresh twin per
target setting. Without the venv only llmc-trace's column is filled.

    python benchmarks/instance_tracing.py --targets both        # every built-in, ~10-20 min
    python benchmarks/instance_tracing.py --models Qwen/Qwen2-VL-2B-Instruct --targets Linear

Prints a table row per (model, modality, targets) with each tool's status, seconds and modules,
the reason under each row a tool did not verify, then per target setting ``llmc-trace N/M
verified, llm-compressor K/M verified``, the same count for modules, the median and slowest
seconds, and the cases one tool passes and the other does not (by the other's reason).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _reference.instance_tracing_llmcompressor import CASE_TIMEOUT_S, check_replay, on_alarm
from _worker import failure_text

HERE = Path(__file__).resolve().parent
REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_WORKER = HERE / "_reference" / "instance_tracing_llmcompressor.py"
SEQ_LEN = 32
#: target setting -> llmc-trace's ``sequential_targets`` (llm-compressor: "default" or the list)
TARGET_SETTINGS: dict[str, list[str] | None] = {"default": None, "Linear": ["Linear"]}
REASON_CHARS = 220


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    modality: str
    targets: str  # a key of TARGET_SETTINGS


@dataclass(frozen=True)
class Outcome:
    status: str  # ok, wrong, failed; skipped: llm-compressor never got the model
    seconds: float | None = None
    reason: str | None = None
    modules_ok: bool | None = None  # None: nothing replayed
    modules_reason: str | None = None
    handoff: str | None = None  # llm-compressor: why it got the pickled twin

    @property
    def cell(self) -> str:
        seconds = "" if self.seconds is None else f"{self.seconds:6.2f}"
        modules = {None: "-", True: "same", False: "differ"}[self.modules_ok]
        return f"{self.status:<7}{seconds:>6}{modules:>8}"


def build(name: str) -> tuple[Any, str]:
    """The tiny twin of a built-in, with sdpa attention where transformers accepts it."""
    from llmc_trace.models.build import build_twin
    from llmc_trace.models.source import resolve_model

    source = resolve_model(name)
    try:
        return build_twin(source, seed=1, attn_implementation="sdpa"), "sdpa"
    except ValueError:  # transformers: this architecture does not support sdpa
        return build_twin(source, seed=1, attn_implementation="eager"), "eager"


def run_ours(model: Any, sample: dict[str, Any], targets: list[str] | None) -> Outcome:
    """llmc-trace's ``trace_subgraphs`` on ``model``, timed, then its replay checked."""
    import llmc_trace
    from llmc_trace.graph.verify import replay

    start = time.perf_counter()
    try:
        subgraphs = llmc_trace.trace_subgraphs(model, sample, targets)
    except Exception as err:  # NotTraceableError or a crash: the case failed
        return Outcome("failed", time.perf_counter() - start, failure_text(err))
    seconds = time.perf_counter() - start
    reason, modules = check_replay(model, lambda: replay(model, subgraphs, sample), sample)
    return Outcome("ok" if reason is None else "wrong", seconds, reason, modules is None, modules)


def prepare_and_run_ours(
    name: str, modality: str, folder: Path, settings: list[str]
) -> tuple[dict[str, Outcome], dict[str, Any] | None]:
    """Save the twin and sample to ``folder`` for the reference, then run llmc-trace on each
    target setting (a fresh twin each); also returns what the worker needs to load the twin
    (the attention, whether ``save_pretrained`` failed), None when there is no twin."""
    import torch
    from llmc_trace.models.samples import SampleOptions, make_sample

    try:
        twin, attn = build(name)
        sample = make_sample(twin.config, modality, SampleOptions(seq_len=SEQ_LEN))
    except Exception as err:  # no twin or no sample: neither tool can be asked
        failed = Outcome("failed", None, f"setup: {failure_text(err)}")
        return {setting: failed for setting in settings}, None
    folder.mkdir()
    torch.save(sample, folder / "sample.pt")
    torch.save(twin, folder / "model.pt")  # for the worker, where a shrunk config will not save
    handoff = {"attn_implementation": attn, "save_error": None}
    try:
        twin.save_pretrained(folder)
    except Exception as err:  # transformers validates the shrunk config: the pickle goes
        handoff["save_error"] = f"save_pretrained: {failure_text(err)}"
    outcomes = {}
    for index, setting in enumerate(settings):
        model = twin if index == 0 else build(name)[0]
        signal.alarm(CASE_TIMEOUT_S)
        try:
            outcomes[setting] = run_ours(model, sample, TARGET_SETTINGS[setting])
        except TimeoutError as err:
            outcomes[setting] = Outcome("failed", None, failure_text(err))
        finally:
            signal.alarm(0)
    return outcomes, handoff


def run_theirs(jobs: list[dict[str, Any]], tmp: Path) -> dict[str, Outcome]:
    """The reference worker over ``jobs``; restarted after a case that kills it."""
    results: dict[str, Outcome] = {}
    pending = jobs
    while pending:
        manifest = tmp / "manifest.json"
        manifest.write_text(json.dumps(pending))
        log_path = tmp / "worker.log"
        with log_path.open("w") as log:
            command = [str(REFERENCE_PYTHON), str(REFERENCE_WORKER), str(manifest)]
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
            assert child.stdout is not None
            for line in child.stdout:
                if line.startswith("RESULT "):
                    result = json.loads(line.removeprefix("RESULT "))
                    outcome = Outcome(
                        result["status"],
                        result.get("seconds"),
                        result["reason"],
                        result.get("modules_ok"),
                        result.get("modules_reason"),
                        result.get("handoff"),
                    )
                    results[result["id"]] = outcome
                    label = next(job["label"] for job in pending if job["id"] == result["id"])
                    print(f"  llm-compressor {label}: {outcome.cell}", file=sys.stderr)
            code = child.wait()
        missing = [job for job in pending if job["id"] not in results]
        if missing:
            tail = (log_path.read_text().strip().splitlines() or ["no output"])[-1]
            results[missing[0]["id"]] = Outcome("failed", None, f"worker died ({code}): {tail}")
        pending = missing[1:]
    return results


def short(reason: str | None) -> str:
    text = " ".join((reason or "").split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def print_table(cases: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome]) -> None:
    width = max(len(case.model) for case in cases) + 2
    tool_header = f"{'status':<7}{'s':>6}{'modules':>8}"
    print(f"  {'':<{width + 19}}{'llmc-trace':<24}llm-compressor")
    print(f"  {'model':<{width}}{'modality':<10}{'targets':<9}{tool_header:<24}{tool_header}")
    for case in cases:
        mine, other = ours[case.id], theirs.get(case.id)
        other_cell = "no venv" if other is None else other.cell
        print(
            f"  {case.model:<{width}}{case.modality:<10}{case.targets:<9}{mine.cell:<24}{other_cell}"
        )
        for tool, outcome in (("llmc-trace", mine), ("llm-compressor", other)):
            if outcome is None:
                continue
            if outcome.status != "ok":
                print(f"      ! {tool} {outcome.status}: {short(outcome.reason)}")
            if outcome.modules_ok is False and outcome.modules_reason != outcome.reason:
                print(f"      ! {tool} modules differ: {short(outcome.modules_reason)}")
            if outcome.handoff:
                print(f"      · {tool} got the {short(outcome.handoff)}")


def seconds_summary(outcomes: list[Outcome]) -> str:
    seconds = [o.seconds for o in outcomes if o.seconds is not None]
    if not seconds:
        return "-"
    return f"median {statistics.median(seconds):.2f} s, slowest {max(seconds):.2f} s"


def print_one_sided(
    chosen: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome], modules: bool
) -> None:
    """The cases one tool passes and the other does not, by the loser's reason."""
    passes: dict[str, Any] = {
        "verified": lambda o: o.status == "ok",
        "submodule outputs as eager": lambda o: o.modules_ok is True,
    }
    what = "submodule outputs as eager" if modules else "verified"
    tools = (("llmc-trace", ours), ("llm-compressor", theirs))
    for (winner, won), (loser, lost) in (tools, tools[::-1]):
        only = [c for c in chosen if passes[what](won[c.id]) and not passes[what](lost[c.id])]
        print(f"  {what} by {winner} only: {len(only)}")
        by_reason: dict[str, list[str]] = {}
        for case in only:
            outcome = lost[case.id]
            reason = (
                outcome.modules_reason if modules and outcome.modules_reason else outcome.reason
            )
            key = f"{loser} {outcome.status}: {short(reason)}"
            by_reason.setdefault(key, []).append(f"{case.model} · {case.modality}")
        for key, labels in by_reason.items():
            print(f"    {', '.join(labels)}: {key}")


def print_summary(
    cases: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome], reference: bool
) -> None:
    tools = (("llmc-trace", ours), ("llm-compressor", theirs))[: 1 + reference]
    for setting in TARGET_SETTINGS:
        chosen = [case for case in cases if case.targets == setting]
        if not chosen:
            continue
        counts = [
            (
                tool,
                sum(r[c.id].status == "ok" for c in chosen),
                sum(r[c.id].modules_ok is True for c in chosen),
            )
            for tool, r in tools
        ]
        total = len(chosen)
        print(f"{setting} targets: " + ", ".join(f"{t} {n}/{total} verified" for t, n, _ in counts))
        skipped = sum(theirs[c.id].status == "skipped" for c in chosen) if reference else 0
        if skipped:
            print(f"  ({skipped} cases could not be handed to llm-compressor: skipped)")
        print(
            "  submodule outputs as eager: " + ", ".join(f"{t} {m}/{total}" for t, _, m in counts)
        )
        for tool, results in tools:
            print(
                f"  {tool} trace_subgraphs seconds: {seconds_summary([results[c.id] for c in chosen])}"
            )
        if reference:
            print_one_sided(chosen, ours, theirs, modules=False)
            print_one_sided(chosen, ours, theirs, modules=True)


def benchmark(models: list[str], settings: list[str]) -> None:
    from llmc_trace.models.samples import supported_modalities
    from llmc_trace.models.source import resolve_model

    reference = REFERENCE_PYTHON.exists()
    start = time.perf_counter()
    print(f"instance tracing: {len(models)} models, targets {', '.join(settings)}")
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if not reference:
        print(f"no llm-compressor venv at {REFERENCE_PYTHON}: run benchmarks/reference_env.sh")
    signal.signal(signal.SIGALRM, on_alarm)
    cases: list[Case] = []
    ours: dict[str, Outcome] = {}
    theirs: dict[str, Outcome] = {}
    jobs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="instance_tracing_") as tmp_name:
        tmp = Path(tmp_name)
        for name in models:
            for modality in supported_modalities(resolve_model(name).config()):
                folder = tmp / f"{len(cases):04d}"
                outcomes, handoff = prepare_and_run_ours(name, modality, folder, settings)
                for setting, outcome in outcomes.items():
                    case = Case(f"{len(cases):04d}", name, modality, setting)
                    cases.append(case)
                    ours[case.id] = outcome
                    label = f"{name} · {modality} · {setting}"
                    print(f"  llmc-trace {label}: {outcome.cell}", file=sys.stderr)
                    if handoff is None:  # no twin: llm-compressor has nothing to trace either
                        theirs[case.id] = outcome
                        continue
                    targets = TARGET_SETTINGS[setting]
                    jobs.append(
                        {
                            "id": case.id,
                            "label": label,
                            "folder": str(folder),
                            "sample": str(folder / "sample.pt"),
                            **handoff,
                            "targets": "default" if targets is None else targets,
                        }
                    )
        if reference:
            theirs.update(run_theirs(jobs, tmp))
    print()
    print_table(cases, ours, theirs)
    print()
    print_summary(cases, ours, theirs, reference)
    print(f"load average (1 min) at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"wall time: {time.perf_counter() - start:.0f} s")


def main() -> None:
    from llmc_trace.models.source import builtin_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help="built-in names (default: all)")
    parser.add_argument("--targets", choices=["default", "Linear", "both"], default="both")
    args = parser.parse_args()
    settings = list(TARGET_SETTINGS) if args.targets == "both" else [args.targets]
    benchmark(args.models or builtin_names(), settings)


if __name__ == "__main__":
    main()
