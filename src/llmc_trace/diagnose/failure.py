"""Turn any exception raised while tracing into a located, classified :class:`TraceFailure`.

torch.fx's own message ("symbolically traced variables cannot be used as inputs to control
flow") names no file, line or module. Ours names the innermost line of *model* code, the
function around it, the module being traced (path and class) and the modules above it, and the
origin of the offending value as the chain of graph nodes that produced it from a model input
(``image_grid_thw -> getitem -> prod -> bool``).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from llmc_trace.errors import TraceStopped
from llmc_trace.graph.verify import Verification
from llmc_trace.tracing.proxy import DataDependentQuestion
from llmc_trace.tracing.rebuild import Unrepresentable
from llmc_trace.tracing.source import SourceLocation, model_frames_of_traceback
from llmc_trace.tracing.tracer import WeightMutation

#: Kinds of failure, each with the sentence that explains it.
KINDS: dict[str, str] = {
    "control_flow": "control flow (if/while/assert) on a value that depends on tensor data",
    "iteration": "iteration over a traced value whose length depends on tensor data",
    "len": "len() of a traced value whose size depends on tensor data",
    "python_number": "int()/float()/index of a traced value that depends on tensor data",
    "membership": "an `in` test on a traced value that depends on tensor data",
    "tensor_to_python": ".item()/.tolist()/.cpu()/.numpy() result used as a Python value",
    "data_dependent_shape": "a decision on a shape that depends on tensor data",
    "constructor": "a tensor constructor (torch.tensor, torch.zeros, ...) fed a traced value",
    "unsupported_argument": "a value the graph cannot hold passed to a traced operation",
    "weight_mutation": "an in-place write to the model's own weights or buffers, which a "
    "calibration pass would repeat on every batch",
    "error": "an exception raised by the model code while tracing",
    "replay": "a replay that fails where the model runs: the trace took a Python value (a "
    "branch, a list, a None) from the tracing sample that the replay's values contradict",
}
_TO_PYTHON = {"item", "tolist", "cpu", "numpy", "__int__", "__float__"}
_SHAPE_OPS = {"size", "shape", "numel", "dim"}
_QUESTION_KINDS = {
    "bool": "control_flow",
    "iter": "iteration",
    "len": "len",
    "int": "python_number",
    "index": "python_number",
    "float": "python_number",
    "contains": "membership",
    "keys": "iteration",
}


@dataclass(frozen=True)
class TraceFailure:
    """Where and why tracing stopped; see the module docstring."""

    kind: str
    message: str
    location: SourceLocation | None
    module_path: str
    module_class: str
    module_stack: list[tuple[str, str]]
    origin: list[str]
    exception: str
    call_stack: list[SourceLocation] = field(default_factory=list)  # model frames, outermost first
    raw_traceback: str = field(default="", repr=False)

    @property
    def explanation(self) -> str:
        return KINDS.get(self.kind, self.kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "explanation": self.explanation,
            "message": self.message,
            "location": self.location.to_json() if self.location else None,
            "module_path": self.module_path,
            "module_class": self.module_class,
            "module_stack": [{"path": p, "class": c} for p, c in self.module_stack],
            "origin": self.origin,
            "exception": self.exception,
            "call_stack": [frame.to_json() for frame in self.call_stack],
        }


def describe_node(node: fx.Node) -> str:
    if node.op == "placeholder":
        return str(node.target)
    if node.op == "call_module":
        return f"{node.target}"
    if node.op == "get_attr":
        return str(node.target)
    target = node.target
    if node.op == "call_function" and getattr(target, "__name__", "") == "getattr":
        return str(node.args[1]) if len(node.args) > 1 else "getattr"
    return getattr(target, "__name__", str(target))


def origin_chain(node: fx.Node) -> list[str]:
    """The graph nodes from a model input (or parameter) to ``node``, data-dependent path first."""
    chain = [node]
    current = node
    while current.all_input_nodes:
        inputs = current.all_input_nodes
        dynamic = [n for n in inputs if not n.meta.get("value_static", False)]
        current = (dynamic or inputs)[0]
        chain.append(current)
    return [describe_node(n) for n in reversed(chain)]


def failure_from_exception(stopped: TraceStopped) -> TraceFailure:
    """Classify what stopped :func:`llmc_trace.tracing.trace.trace_graph`."""
    err = stopped.cause
    stack = list(stopped.module_stack)
    module_path, module_class = stack[-1] if stack else ("", "")
    frames = model_frames_of_traceback(err.__traceback__)
    location = frames[-1] if frames else None
    origin: list[str] = []
    if isinstance(err, DataDependentQuestion):
        origin = [*origin_chain(err.node), err.question]
        kind = _QUESTION_KINDS.get(err.question, "control_flow")
        if any(step in _TO_PYTHON for step in origin[:-1]):
            kind = "tensor_to_python"
        elif kind not in ("iteration", "len") and (  # those two are about lengths already
            err.reason.startswith(("shape", "length")) or any(step in _SHAPE_OPS for step in origin)
        ):
            kind = "data_dependent_shape"
        message = f"{err.question}() needs a concrete value, but the {err.reason}"
    elif isinstance(err, WeightMutation):
        kind = "weight_mutation"
        origin = [*origin_chain(err.node), err.operation]
        message = str(err)
    else:
        kind, message = _classify_other(err)
    return TraceFailure(
        kind=kind,
        message=message,
        location=location,
        module_path=module_path,
        module_class=module_class,
        module_stack=stack,
        origin=origin,
        exception=f"{type(err).__name__}: {err}",
        call_stack=frames,
        raw_traceback="".join(traceback.format_exception(err)),
    )


def _classify_other(err: BaseException) -> tuple[str, str]:
    text = str(err)
    if isinstance(err, Unrepresentable) or (
        isinstance(err, NotImplementedError) and "argument of type" in text
    ):
        return "unsupported_argument", text
    # a proxy reaching a constructor's argument parser: "not a storage 'MetaProxy'" from the
    # legacy torch.Tensor(...), "must be tuple of ints, but found ... MetaProxy" from sizes
    if "Proxy" in text and any(
        word in text for word in ("storage", "tensor", "zeros", "ones", "full", "ints")
    ):
        return "constructor", text
    return "error", f"{type(err).__name__}: {text}"


def failure_from_replay(verification: Verification) -> TraceFailure | None:
    """The replay's failure, located where the model made the failing operation, as a trace
    failure the fix search can take (the same fixes apply: that code recorded as one call
    runs with the replay's own values); ``None`` when the replay did not fail there."""
    if verification.failed_at is None:
        return None
    location, module_path, module_class = verification.failed_at
    return TraceFailure(
        kind="replay",
        message=verification.replay_error,
        location=location,
        module_path=module_path,
        module_class=module_class,
        module_stack=[(module_path, module_class)],
        origin=[],
        exception=verification.replay_error,
        call_stack=[location],
    )
