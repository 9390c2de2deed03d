"""``trace_subgraphs`` on model instances: llmc-trace against llm-compressor 0.14, same run.

llm-compressor users call ``trace_subgraphs(model, sample_input, sequential_targets, ignore)``
with a loaded model and one batch. For every built-in model and every modality its forward
takes, the tiny twin (``build_twin(source, seed=1)``, sdpa attention, eager where transformers
refuses sdpa) and its sample (32 tokens, built as ``attempt`` builds it: ``sample_for``, which
sizes media no builder knows by the twin's own feature method) go to both tools'
``trace_subgraphs``, with two target settings:

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
of that submodule returned in the eager forward (forward hooks on every submodule; the decoder
layers, Linears, norms, towers: what a calibration hook sees), so a replay that computes every layer
right but drops the model output (``wrong``, ``same``) is told apart from one that computes
wrong values (``differ``). Seconds are the ``trace_subgraphs`` call alone (for llmc-trace, a
search for a verified fix included when the model does not trace as written; each tool's first
call also pays one-time imports). A case gets 120 s.

llm-compressor runs in ``benchmarks/.venv-llmc`` (``bash benchmarks/reference_env.sh``), one
process for all cases (``_reference/instance_tracing_llmcompressor.py``; a case that kills it
is recorded as failed and the process restarts after it): each twin is saved with
``save_pretrained`` and loaded there with the class its config names, the same attention and
float32 (where transformers cannot save or reload a twin's shrunk config, the twin itself,
pickled with ``torch.save``: the row says so), the sample passed with ``torch.save``; it replays
in the context its pipeline calibrates in (eager attention among it), but with the lm_head left
on its weights; it reports its environment (``benchmarks/_environment.py``) first. Both sides
judge the replay with the same function. llmc-trace runs in this process, on a fresh twin per
target setting. Without the venv only llmc-trace's column is filled.

    python benchmarks/instance_tracing.py --targets both        # every built-in, ~10-20 min
    python benchmarks/instance_tracing.py --models Qwen/Qwen2-VL-2B-Instruct --targets Linear \\
        --result /tmp/instance_tracing.json

Writes ``benchmarks/results/instance_tracing.json`` (``--result`` names another file): every
case with both tools' outcomes, and per target setting the counts and each tool's seconds over
the cases (one call per case: what a user's one call costs; they are not repeated); and
prints the tables ``tables(result)`` renders from it for the docs: ``cases`` (a row per
(model, modality, targets) with each tool's status, seconds and modules, and why a tool did not
verify), ``summary`` (per target setting, ``N of M`` verified and modules as eager for each
tool), ``seconds`` (median, fastest and slowest call) and ``one_sided`` (the cases one tool
passes and the other does not, by the other's reason).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _reference.instance_tracing_llmcompressor import (  # noqa: E402
    CASE_TIMEOUT_S,
    check_replay,
    on_alarm,
)
from _results import Run, spread, spread_text  # noqa: E402
from _worker import failure_text  # noqa: E402

REFERENCE_PYTHON = HERE / ".venv-llmc" / "bin" / "python"
REFERENCE_WORKER = HERE / "_reference" / "instance_tracing_llmcompressor.py"
SEQ_LEN = 32
#: target setting -> llmc-trace's ``sequential_targets`` (llm-compressor: "default" or the list)
TARGET_SETTINGS: dict[str, list[str] | None] = {"default": None, "Linear": ["Linear"]}
REASON_CHARS = 220
#: ``Outcome.modules_ok`` as a cell: None when nothing was replayed.
MODULES = {None: "-", True: "same", False: "differ"}


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
        """The progress line's status, seconds and modules."""
        seconds = "" if self.seconds is None else f"{self.seconds:6.2f}"
        return f"{self.status:<7}{seconds:>6}{MODULES[self.modules_ok]:>8}"


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
    from llmc_trace.models.samples import SampleOptions
    from llmc_trace.traced.probe import sample_for

    try:
        twin, attn = build(name)
        # on a twin of its own: sizing media runs the feature method, and the output hooks
        # transformers installs on a first call would stop the twin from pickling
        sample = sample_for(build(name)[0], modality, SampleOptions(seq_len=SEQ_LEN))
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


def run_theirs(
    jobs: list[dict[str, Any]], tmp: Path
) -> tuple[dict[str, Outcome], dict[str, Any] | None]:
    """The reference worker over ``jobs``, restarted after a case that kills it; and the
    environment the worker reported."""
    results: dict[str, Outcome] = {}
    environment = None
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
                if line.startswith("ENVIRONMENT "):
                    environment = json.loads(line.removeprefix("ENVIRONMENT "))
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
    return results, environment


def short(reason: str | None) -> str:
    text = " ".join((reason or "").split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def why_not(tool: str, outcome: Outcome | None) -> list[str]:
    """Why ``tool`` did not verify, why its modules differ, what it was handed."""
    if outcome is None:
        return []
    notes = []
    if outcome.status != "ok":
        notes.append(f"{tool} {outcome.status}: {short(outcome.reason)}")
    if outcome.modules_ok is False and outcome.modules_reason != outcome.reason:
        notes.append(f"{tool} modules differ: {short(outcome.modules_reason)}")
    if outcome.handoff:
        notes.append(f"{tool} got the {short(outcome.handoff)}")
    return notes


def cases_table(cases: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome]) -> str:
    """One row per (model, modality, targets): each tool's status, seconds and modules, and
    why a tool did not verify."""
    lines = [
        "| model | modality | targets | llmc-trace | s | modules | llm-compressor | s | modules "
        "| why not |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        cells = []
        for outcome in (ours[case.id], theirs.get(case.id)):
            if outcome is None:
                cells += ["no venv", "", ""]
                continue
            seconds = "" if outcome.seconds is None else f"{outcome.seconds:.2f}"
            cells += [outcome.status, seconds, MODULES[outcome.modules_ok]]
        notes = why_not("llmc-trace", ours[case.id])
        notes += why_not("llm-compressor", theirs.get(case.id))
        lines.append(
            f"| {case.model} | {case.modality} | {case.targets} | {' | '.join(cells)} "
            f"| {cell('; '.join(notes))} |"
        )
    return "\n".join(lines)


def seconds_spread(outcomes: list[Outcome]) -> dict[str, Any] | None:
    """The ``trace_subgraphs`` seconds of a setting's cases (one call each) as a spread."""
    seconds = [o.seconds for o in outcomes if o.seconds is not None]
    return spread(seconds, digits=3) if seconds else None


def counts(
    cases: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome], reference: bool
) -> dict[str, dict[str, Any]]:
    """Per target setting: the cases, and per tool how many verified, how many computed every
    submodule as eager, and the spread of its seconds over the cases."""
    tools = (("llmc-trace", ours), ("llm-compressor", theirs))[: 1 + reference]
    result = {}
    for setting in TARGET_SETTINGS:
        chosen = [case for case in cases if case.targets == setting]
        if not chosen:
            continue
        result[setting] = {
            "cases": len(chosen),
            "skipped": sum(theirs[c.id].status == "skipped" for c in chosen) if reference else 0,
            **{
                tool: {
                    "verified": sum(r[c.id].status == "ok" for c in chosen),
                    "modules_as_eager": sum(r[c.id].modules_ok is True for c in chosen),
                    "seconds": seconds_spread([r[c.id] for c in chosen]),
                }
                for tool, r in tools
            },
        }
    return result


def summary_table(tally: dict[str, dict[str, Any]]) -> str:
    """Per target setting: how many cases each tool verified, and how many computed every
    submodule as eager (what calibration hooks see)."""
    lines = [
        "| targets | llmc-trace verified | llm-compressor verified | modules as eager, llmc-trace "
        "| modules as eager, llm-compressor |",
        "|---|---|---|---|---|",
    ]
    for setting, t in tally.items():
        total = t["cases"]

        def of(tool: str, key: str, total: int = total, t: dict[str, Any] = t) -> str:
            return f"{t[tool][key]} of {total}" if tool in t else "no venv"

        lines.append(
            f"| {setting} | {of('llmc-trace', 'verified')} | {of('llm-compressor', 'verified')} "
            f"| {of('llmc-trace', 'modules_as_eager')} "
            f"| {of('llm-compressor', 'modules_as_eager')} |"
        )
    return "\n".join(lines)


def seconds_table(tally: dict[str, dict[str, Any]]) -> str:
    """Per target setting and tool: the ``trace_subgraphs`` seconds over the cases (one call
    each): median, fastest and slowest."""
    lines = ["| targets | tool | trace_subgraphs s over the cases |", "|---|---|---|"]
    for setting, t in tally.items():
        for tool in ("llmc-trace", "llm-compressor"):
            if tool in t:
                lines.append(f"| {setting} | {tool} | {spread_text(t[tool]['seconds'], '.2f')} |")
    return "\n".join(lines)


def one_sided_table(
    cases: list[Case], ours: dict[str, Outcome], theirs: dict[str, Outcome]
) -> str:
    """The cases one tool passes and the other does not, grouped by the loser's reason."""
    passes: dict[str, Any] = {
        "verified": lambda o: o.status == "ok",
        "modules as eager": lambda o: o.modules_ok is True,
    }
    lines = ["| targets | passed | by | not by | cases | why not |", "|---|---|---|---|---|---|"]
    tools = (("llmc-trace", ours), ("llm-compressor", theirs))
    for setting in TARGET_SETTINGS:
        chosen = [case for case in cases if case.targets == setting]
        for what, passed in passes.items():
            for (winner, won), (loser, lost) in (tools, tools[::-1]):
                only = [c for c in chosen if passed(won[c.id]) and not passed(lost[c.id])]
                by_reason: dict[str, list[str]] = {}
                for case in only:
                    outcome = lost[case.id]
                    modules = what == "modules as eager" and outcome.modules_reason
                    reason = outcome.modules_reason if modules else outcome.reason
                    key = f"{outcome.status}: {short(reason)}"
                    by_reason.setdefault(key, []).append(f"{case.model} · {case.modality}")
                for key, labels in by_reason.items():
                    lines.append(
                        f"| {setting} | {what} | {winner} | {loser} | {cell(', '.join(labels))} "
                        f"| {cell(key)} |"
                    )
    return "\n".join(lines)


def tables(result: dict[str, Any]) -> dict[str, str]:
    """``summary``: per target setting, verified and modules-as-eager counts of both tools;
    ``seconds``: their ``trace_subgraphs`` seconds over the cases; ``cases``: every case;
    ``one_sided`` (with the reference): the cases one tool passes and the other does not."""
    figures = result["figures"]
    cases = [Case(**c["case"]) for c in figures["cases"]]
    ours = {c["case"]["id"]: Outcome(**c["ours"]) for c in figures["cases"]}
    theirs = {c["case"]["id"]: Outcome(**c["theirs"]) for c in figures["cases"] if c["theirs"]}
    rendered = {
        "summary": summary_table(figures["counts"]),
        "seconds": seconds_table(figures["counts"]),
        "cases": cases_table(cases, ours, theirs),
    }
    if figures["reference"]:
        rendered["one_sided"] = one_sided_table(cases, ours, theirs)
    return rendered


def headline(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The README's summary row: ``trace_subgraphs`` on every built-in twin, default targets."""
    t = result["figures"]["counts"]["default"]
    theirs = t.get("llm-compressor")
    return [(
        "trace_subgraphs on every built-in twin beside llm-compressor 0.14",
        f"replay equals eager in {t['llmc-trace']['verified']} of {t['cases']} cases"
        + (f" vs {theirs['verified']}" if theirs else ""),
    )]


def benchmark(models: list[str], settings: list[str], result_path: Path | None) -> None:
    from llmc_trace.models.samples import supported_modalities
    from llmc_trace.models.source import resolve_model

    run = Run("instance_tracing")
    reference = REFERENCE_PYTHON.exists()
    print(f"instance tracing: {len(models)} models, targets {', '.join(settings)}")
    if not reference:
        print(f"no llm-compressor venv at {REFERENCE_PYTHON}: run benchmarks/reference_env.sh")
    signal.signal(signal.SIGALRM, on_alarm)
    cases: list[Case] = []
    ours: dict[str, Outcome] = {}
    theirs: dict[str, Outcome] = {}
    jobs: list[dict[str, Any]] = []
    environment = None
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
            found, environment = run_theirs(jobs, tmp)
            theirs.update(found)
    tally = counts(cases, ours, theirs, reference)
    figures = {
        "models": len(models),
        "settings": settings,
        "seq_len": SEQ_LEN,
        "case_timeout_s": CASE_TIMEOUT_S,
        "reference": reference,
        "counts": tally,
        "cases": [
            {
                "case": asdict(case),
                "ours": asdict(ours[case.id]),
                "theirs": asdict(theirs[case.id]) if case.id in theirs else None,
            }
            for case in cases
        ],
    }
    rendered = tables({"figures": figures})
    for key in ("cases", "summary", "seconds", "one_sided"):
        if key in rendered:
            print()
            print(rendered[key])
    notes = [
        f"{setting} targets: {t['skipped']} cases could not be handed to llm-compressor "
        "(skipped)."
        for setting, t in tally.items()
        if t["skipped"]
    ]
    for note in notes:
        print(note)
    run.write(
        figures,
        environments={"llm-compressor worker": environment} if environment else {},
        notes=notes,
        path=result_path,
    )


def main() -> None:
    from llmc_trace.models.source import builtin_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help="built-in names (default: all)")
    parser.add_argument("--targets", choices=["default", "Linear", "both"], default="both")
    parser.add_argument(
        "--result", type=Path, help="where to write the result (default: benchmarks/results/)"
    )
    args = parser.parse_args()
    settings = list(TARGET_SETTINGS) if args.targets == "both" else [args.targets]
    benchmark(args.models or builtin_names(), settings, args.result)


if __name__ == "__main__":
    main()
