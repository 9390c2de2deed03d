"""llm-compressor's ``trace_subgraphs`` on saved tiny models, each replayed against eager.

Runs inside ``benchmarks/.venv-llmc`` (see ``benchmarks/reference_env.sh``), started once by
``benchmarks/instance_tracing.py`` for all its cases (imports are paid once). It imports
nothing from llmc-trace. Each case of the manifest (a JSON list) names a model folder written
by ``save_pretrained``, a sample saved with ``torch.save``, the attention implementation and
the sequential targets (``"default"`` or a list of names), and ``save_error`` when
``save_pretrained`` failed. Per case, as llm-compressor's
sequential pipeline does before it calibrates (``pipelines/sequential/pipeline.py``):

* the model is loaded as a user would (the class named by ``architectures[0]``, float32, the
  same attention implementation), or, where transformers refuses the twin's shrunk config,
  unpickled from ``model.pt`` beside it; ``set_onload_device`` prepares it for onloading;
* ``"default"`` targets resolve through ``infer_sequential_targets(model, None)``
  (``model._no_split_modules`` under transformers 5), the ignore list is
  ``DatasetArguments().tracing_ignore``;
* ``trace_subgraphs`` is timed, then the subgraphs are replayed in order inside the context
  the pipeline calibrates in (no grad, cache off, eval, hub kernels off, eager attention), all
  but ``disable_lm_head``, which would leave the logits on ``meta``.

:func:`check_replay` compares the replay with ``model(**sample, use_cache=False)``; the
benchmark uses the same function for llmc-trace, so both tools get one verdict rule. Prints
``ENVIRONMENT {json}`` first (``benchmarks/_environment.py``), then one ``RESULT {json}`` line
per case: ``id``, ``status`` (``ok``, ``wrong``, ``failed``, or
``skipped`` when the model could not be loaded at all), ``handoff`` (why the pickle was used),
``seconds`` of the ``trace_subgraphs`` call, ``subgraphs``, ``targets`` and ``reason``, and
``modules_ok`` / ``modules_reason``: whether every submodule call the replay made returned
what it returned in the eager forward (what calibration hooks see).

    python instance_tracing_llmcompressor.py MANIFEST.json
"""

from __future__ import annotations

import contextlib
import inspect
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/_worker.py, ...
from _environment import describe  # noqa: E402
from _worker import failure_text  # noqa: E402

#: A replayed output matches when max |replay - eager| <= this x max |eager| (per tensor).
RELATIVE_TOLERANCE = 1e-4
CASE_TIMEOUT_S = 120


def eager_kwargs(model: Any, sample: dict[str, Any]) -> dict[str, Any]:
    """``use_cache=False`` where the forward takes it (and the sample does not set it)."""
    parameters = inspect.signature(type(model).forward).parameters
    takes = "use_cache" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return {"use_cache": False} if takes and "use_cache" not in sample else {}


def float_tensors(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every floating tensor in a model output, by path (``logits``, ``0.1``, ...)."""
    import torch

    if isinstance(value, torch.Tensor):
        return {prefix or "output": value} if value.is_floating_point() else {}
    items: Any = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    found: dict[str, Any] = {}
    for key, item in items:
        found.update(float_tensors(item, f"{prefix}.{key}" if prefix else str(key)))
    return found


def mismatch(expected: Any, actual: Any) -> str | None:
    """Why ``actual`` does not reproduce ``expected`` (every floating tensor), or None."""
    got = float_tensors(actual)
    wanted = float_tensors(expected)
    if not wanted:
        return "the eager output holds no floating tensor"
    if not got:
        return f"the replay returns no output tensor (it returns {type(actual).__name__} {actual!r:.40})"
    for name, reference in wanted.items():
        if name not in got:
            return f"replay has no {name} (it has {sorted(got)[:4]})"
        value = got[name]
        if value.shape != reference.shape:
            return f"{name}: shape {tuple(value.shape)}, eager {tuple(reference.shape)}"
        if value.is_meta:
            return f"{name} is on meta"
        if not reference.numel():
            continue
        # overflowed in both (inf, -inf or NaN: eager and sdpa attention may disagree which)
        same = (value == reference) | (~value.isfinite() & ~reference.isfinite())
        diff = (value.double() - reference.double()).abs().masked_fill(same, 0.0)
        worst = float(diff.nan_to_num(nan=float("inf")).max())
        scale = float(reference.double().abs().masked_fill(~reference.isfinite(), 0.0).max())
        if worst > RELATIVE_TOLERANCE * max(scale, 1e-12):
            return f"{name}: max abs difference {worst:.3g} against max |eager| {scale:.3g}"
    return None


def recording_modules(model: Any, run: Callable[[], Any]) -> tuple[Any, dict[str, list[Any]]]:
    """``run()`` and the floating outputs of each submodule call it made, in call order per
    module path: what calibration hooks on those modules would see."""
    calls: dict[str, list[Any]] = {}

    def hook(name: str) -> Callable[..., None]:
        def record(module: Any, args: Any, output: Any) -> None:
            found = float_tensors(output)
            if found:
                calls.setdefault(name, []).append({k: t.detach().clone() for k, t in found.items()})

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        return run(), calls
    finally:
        for handle in handles:
            handle.remove()


def modules_mismatch(eager: dict[str, list[Any]], replayed: dict[str, list[Any]]) -> str | None:
    """The first module (in eager call order) with a replay call that no call of the eager
    forward matches, or None. Calls are matched by value, not by order: a trace may run
    independent calls of one module in another order (Pegasus-X's norm on local, then global
    tokens); eager calls the replay does not make are not judged."""
    common = [name for name in eager if name in replayed]
    if not common:
        return "the replay called none of the submodules the eager forward called"
    for name in common:
        unmatched = list(eager[name])
        for index, call in enumerate(replayed[name]):
            found = next((i for i, c in enumerate(unmatched) if mismatch(c, call) is None), None)
            if found is None:
                why = mismatch(unmatched[0], call) if unmatched else "more calls than eager"
                return f"{name} (replay call {index}): {why}"
            del unmatched[found]
    return None


def check_replay(
    model: Any, replay: Callable[[], Any], sample: dict[str, Any]
) -> tuple[str | None, str | None]:
    """Run ``replay`` (the subgraphs in order), then the eager forward, from the same random
    state (SpeechT5 keeps a dropout on in eval mode; RWKV rescales its weights on its first
    eager call, so the replay goes first). Returns why the model outputs differ and why the
    outputs of the submodules both runs called differ (modules a trace walks into are not
    called by a replay), each None when they agree."""
    import torch

    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            actual, replayed = recording_modules(model, replay)
        except Exception as err:  # a replay that crashes is a wrong trace
            reason = f"replay failed: {failure_text(err)}"
            return reason, reason
        torch.manual_seed(0)
        try:
            kwargs = eager_kwargs(model, sample)
            expected, eager = recording_modules(model, lambda: model(**sample, **kwargs))
        except Exception as err:
            reason = f"eager forward failed: {failure_text(err)}"
            return reason, reason
    return mismatch(expected, actual), modules_mismatch(eager, replayed)


def run_subgraphs(model: Any, subgraphs: list[Any], sample: dict[str, Any]) -> Any:
    """llm-compressor's pipeline loop for one batch: feed each subgraph its ``input_names``,
    keep its outputs, drop its ``consumed_names``; the last one returns the model output."""
    cache = dict(sample)
    output: Any = None
    for index, subgraph in enumerate(subgraphs):
        output = subgraph.forward(model, **{name: cache[name] for name in subgraph.input_names})
        if index < len(subgraphs) - 1:
            cache.update(output)
            for name in subgraph.consumed_names:
                cache.pop(name, None)
    return output


def load_model(case: dict[str, Any]) -> tuple[Any, str | None]:
    """The model as a user loads it, or the pickled twin (``model.pt``, the same object) when
    transformers cannot save or load the twin's shrunk config; the second value says why."""
    import torch

    try:
        if case["save_error"]:
            raise RuntimeError(case["save_error"])
        return from_pretrained(case["folder"], case["attn_implementation"]), None
    except Exception as err:
        pickled = Path(case["folder"]) / "model.pt"
        if not pickled.exists():
            raise
        why = case["save_error"] or f"from_pretrained: {failure_text(err)}"
        return torch.load(pickled, weights_only=False), f"pickled twin ({why})"


def from_pretrained(folder: str, attn_implementation: str) -> Any:
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    architecture = (config.architectures or ["AutoModel"])[0]
    model_class = getattr(transformers, architecture, transformers.AutoModel)
    model = model_class.from_pretrained(
        folder, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval()


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    import torch
    from compressed_tensors.offload import set_onload_device
    from llmcompressor.args.dataset_arguments import DatasetArguments
    from llmcompressor.pipelines.sequential.helpers import trace_subgraphs
    from llmcompressor.utils import helpers
    from llmcompressor.utils.dev import get_main_device
    from llmcompressor.utils.pytorch.module import infer_sequential_targets

    try:
        model, handoff = load_model(case)
    except Exception as err:  # llm-compressor never got the model: not its result
        return {"status": "skipped", "reason": f"not handed over: {failure_text(err)}"}
    sample = torch.load(case["sample"], weights_only=False)
    set_onload_device(model, get_main_device())
    targets = infer_sequential_targets(
        model, None if case["targets"] == "default" else case["targets"]
    )
    result: dict[str, Any] = {
        "targets": [targets] if isinstance(targets, str) else list(targets),
        "handoff": handoff,
    }
    start = time.perf_counter()
    try:
        subgraphs = trace_subgraphs(model, sample, targets, DatasetArguments().tracing_ignore)
    except Exception as err:
        result.update(seconds=time.perf_counter() - start, status="failed")
        result["reason"] = failure_text(err)
        return result
    result.update(seconds=time.perf_counter() - start, subgraphs=len(subgraphs))

    def replay() -> Any:
        with contextlib.ExitStack() as stack:
            for context in (
                helpers.disable_cache,
                helpers.eval_context,
                helpers.disable_hf_kernels,
                helpers.use_eager_attention,
            ):
                stack.enter_context(context(model))
            return run_subgraphs(model, subgraphs, sample)

    reason, modules = check_replay(model, replay, sample)
    result.update(status="ok" if reason is None else "wrong", reason=reason)
    result.update(modules_ok=modules is None, modules_reason=modules)
    return result


def on_alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"case took over {CASE_TIMEOUT_S} s")


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    environment = describe(["llmcompressor", "compressed-tensors"])
    print("ENVIRONMENT " + json.dumps(environment), flush=True)
    signal.signal(signal.SIGALRM, on_alarm)
    for case in cases:
        signal.alarm(CASE_TIMEOUT_S)
        try:
            result = run_case(case)
        except Exception as err:  # loading or resolving targets failed: the case failed
            result = {"status": "failed", "reason": failure_text(err)}
        finally:
            signal.alarm(0)
        print("RESULT " + json.dumps({"id": case["id"], **result}), flush=True)


if __name__ == "__main__":
    main()
