"""Read the smooth -> balance layer pairs of AWQ and SmoothQuant from a graph of linear calls.

AWQ and SmoothQuant multiply some channels of a layer's output by ``1/s`` and the matching
input columns of the layers that read them by ``s``: the model computes the same function only
if every path from the first layer (the *smooth* layer: a norm or a linear layer) to the
others (the *balance* layers) carries each channel to the same column, through operations a
per-channel scale passes unchanged. This module finds those pairs in a graph in which every
linear layer is a call of its own (a trace with the linear layers as its sequential targets):
from each call of a module with a weight, it follows the value forward

* through views, reshapes, transposes, dtype casts, copies and dropout (they move channels,
  never mix them),
* through a product with a value that carries none of the scaled channels (``up * act(gate)``
  passes the scale of ``up`` to ``down_proj``; ``x * sigmoid(x)`` does not),
* through attention as its *value* (``probs @ v``: each output channel is a mix of the same
  channel over positions),
* and, straight after the smooth layer, through a slice or chunk of its last dimension, which
  narrows the scaled channels to that range (a fused ``qkv_proj`` whose ``v`` part reaches
  ``o_proj``, a ``gate_up_proj`` whose ``up`` half reaches ``down_proj``),

and stops at the first linear layer on each path. Two other calls end a path as linear layers
do: a module that reads its input only through ``F.linear`` with its own weight (a router:
``softmax(x Wᵀ)``, then top-k), read from a trace of the module alone, and a fused experts
module, which stands for every expert's gate and up projection; inside it, each expert's up ->
down is a pair as well (:mod:`llmc_trace.moe.pairs`). A path into anything else (an activation, a
norm, a residual add, softmax, the model's output) blocks the channels it carries; a norm
needs all its channels to reach linear layers, a linear layer at least one range. What comes
out is a :class:`Mapping` per smooth layer with at least one quantized balance layer (the
others, a router or an ignored layer, are scaled too, or the function would change, and stay in
full precision), or a :class:`SkippedMapping` saying why not (no balance layer quantized,
widths that do not match). Only the graph is read here: :mod:`llmc_trace.traced.mappings` proves each pair
by folding a scale on the tiny twin.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from llmc_trace.moe.pairs import expert_inputs, expert_pairs
from llmc_trace.tracing.rewrite import SHAPE_ONLY

#: methods and functions that move channels without mixing them, or only read shapes
_MOVES = frozenset(
    {
        "view", "reshape", "transpose", "permute", "contiguous", "to", "type", "float",
        "half", "bfloat16", "double", "unsqueeze", "squeeze", "flatten", "unflatten",
        "expand", "clone", "detach", "dropout", "repeat_interleave",
    }
)  # fmt: skip
#: of those, the ones that keep the last dimension where it is
_KEEPS_SHAPE = frozenset(
    {
        "to",
        "type",
        "float",
        "half",
        "bfloat16",
        "double",
        "contiguous",
        "clone",
        "detach",
        "dropout",
    }
)
#: calls whose result is no tensor of the value's channels (its shape, dtype, device)
_READS_SHAPE = frozenset({"size", "dim", "shape", "dtype", "device", "numel"})
_PRODUCTS = frozenset({"mul", "mul_"})
_ATTENTION = frozenset({"scaled_dot_product_attention"})
_MATMUL = frozenset({"matmul", "bmm"})


@dataclass(frozen=True)
class Mapping:
    """A smooth layer and the balance layers its output reaches, channel for channel.

    ``rows`` is the range of the smooth layer's output channels that reaches them (``None``:
    all of them; a range for a fused projection whose other parts go elsewhere). ``kept``
    are layers reading the same channels that are not quantized (a mixture's router): the
    scales are folded into them too, so the function stays the same, but chosen for
    ``balance`` alone.
    """

    smooth: str
    balance: tuple[str, ...]
    rows: tuple[int, int] | None = None
    kept: tuple[str, ...] = ()

    def describe(self) -> str:
        rows = f"[{self.rows[0]}:{self.rows[1]}]" if self.rows else ""
        kept = f" (+ {', '.join(self.kept)}, not quantized)" if self.kept else ""
        return f"{self.smooth}{rows} -> {', '.join(self.balance)}{kept}"

    @property
    def readers(self) -> tuple[str, ...]:
        """Every layer the scales are folded into: the balance layers and the kept ones."""
        return (*self.balance, *self.kept)


@dataclass(frozen=True)
class SkippedMapping:
    """A pair the graph shows but that is not smoothed, and why."""

    smooth: str
    balance: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class _Value:
    """A value carrying the smooth layer's channels ``lo:hi``; ``flat`` while its last
    dimension still is the smooth layer's output (a slice there narrows the range)."""

    node: fx.Node
    lo: int
    hi: int
    flat: bool


def derive_mappings(
    graph: fx.Graph,
    model: torch.nn.Module,
    is_linear: Callable[[torch.nn.Module], bool],
    is_target: Callable[[str, torch.nn.Module], bool],
) -> tuple[list[Mapping], list[SkippedMapping]]:
    """Every smooth -> balance pair of ``graph`` (see the module docstring), in graph order.

    ``is_linear`` says which modules are linear layers (a path stops there); ``is_target``
    (asked with a name and its module) which of them are quantized (a pair reaching none is skipped: smoothing it would change
    layers left in full precision for nothing, or an ``lm_head`` tied to the embeddings).
    Fused experts must be observed (:func:`~llmc_trace.moe.observe.observe_experts`): their
    pairs name the projections it installs.
    """
    found: list[Mapping] = []
    skipped: list[SkippedMapping] = []
    linear_calls = _linear_calls(graph, model, is_linear)
    target = functools.cache(lambda name: is_target(name, model.get_submodule(name)))

    def add(smooth: str, names: tuple[str, ...], rows: tuple[int, int], narrowed: bool) -> None:
        reason = _refusal(model, is_linear(model.get_submodule(smooth)), names, rows, target)
        if reason is not None:
            skipped.append(SkippedMapping(smooth, names, reason))
            return
        balance = tuple(n for n in names if target(n))
        kept = tuple(n for n in names if not target(n))
        found.append(Mapping(smooth, balance, rows if narrowed else None, kept))

    for node in graph.nodes:
        if node.op != "call_module":
            continue
        path = str(node.target)
        module = model.get_submodule(path)
        for up, down in expert_pairs(path, module):
            width = _in_features(model.get_submodule(down))
            add(up, (down,), (0, width), narrowed=False)
        width = _output_width(module, is_linear(module))
        if width is None:
            continue
        reached = _follow(model, node, width, linear_calls)
        if reached is None:
            continue
        balance, rows = reached
        if not is_linear(module) and rows != (0, width):
            continue  # a norm smooths all its channels or none
        names = tuple(name for n in balance for name in linear_calls[n])
        if len(set(names)) != len(names):
            continue  # a layer called twice on different values: no one input to balance
        add(path, names, rows, narrowed=rows != (0, width))
    return found, skipped


def _linear_calls(
    graph: fx.Graph, model: torch.nn.Module, is_linear: Callable[[torch.nn.Module], bool]
) -> dict[fx.Node, tuple[str, ...]]:
    """The calls a path stops at, with the layers that read their input: a linear layer
    itself, a router (a module reading its input through its weight alone), every expert's
    gate and up projection for a fused experts module."""
    calls: dict[fx.Node, tuple[str, ...]] = {}
    readers: dict[type, bool] = {}
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        path = str(node.target)
        module = model.get_submodule(path)
        experts = expert_inputs(path, module)
        if experts is not None:
            calls[node] = experts
        elif is_linear(module):
            calls[node] = (path,)
        elif readers.setdefault(type(module), _reads_through_weight(module)):
            calls[node] = (path,)
    return calls


def _reads_through_weight(module: torch.nn.Module) -> bool:
    """Whether ``module`` (no linear layer, no children) reads its first input only through
    ``F.linear`` with its own 2-D ``weight``, the channels on the last dimension: a router's
    logits, ``x Wᵀ``, before its softmax and top-k. Read from a trace of the module alone;
    a module that does not trace so is not one."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or next(module.children(), None):
        return False
    try:
        graph = fx.symbolic_trace(module).graph
    except Exception:  # noqa: BLE001 - any failure to trace means "not known to be one"
        return False
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    frontier, reached = inputs[:1], False
    while frontier:
        node = frontier.pop()
        for user in node.users:
            name = _op_name(user)
            if name in _READS_SHAPE or (name == "getattr" and user.args[1] in _READS_SHAPE):
                continue
            if name in _KEEPS_SHAPE or name in ("view", "reshape"):
                frontier.append(user)
                continue
            weight_arg = user.args[1] if len(user.args) > 1 else None
            if (
                name == "linear"
                and user.args[0] is node
                and isinstance(weight_arg, fx.Node)
                and weight_arg.op == "get_attr"
                and weight_arg.target == "weight"
            ):
                reached = True
                continue
            return False
    return reached


def _in_features(module: torch.nn.Module) -> int:
    """How many input columns a balance layer has: a linear layer's, a router's weight's."""
    from llmc_trace.layers.linear import as_linear

    layer = as_linear(module)
    return layer.in_features if layer is not None else int(module.weight.shape[1])


def _output_width(module: torch.nn.Module, linear: bool) -> int | None:
    """How many output channels a scale folds into: a linear layer's outputs, a norm's
    (a 1-D weight, one per channel); ``None`` for anything else."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return None
    if linear:
        from llmc_trace.layers.linear import as_linear

        layer = as_linear(module)
        return layer.out_features if layer is not None else None
    return int(weight.shape[0]) if weight.dim() == 1 else None


def _follow(
    model: torch.nn.Module, start: fx.Node, width: int, linear_calls: dict[fx.Node, tuple[str, ...]]
) -> tuple[list[fx.Node], tuple[int, int]] | None:
    """The linear calls ``start``'s output reaches and the channel range that reaches them;
    ``None`` when no channel reaches a linear layer without being blocked on another path."""
    frontier = [_Value(start, 0, width, True)]
    carried: dict[fx.Node, tuple[int, int]] = {start: (0, width)}
    balance: list[fx.Node] = []
    reaching: list[tuple[int, int]] = []
    blocked: list[tuple[int, int]] = []
    while frontier:
        value = frontier.pop()
        for user in value.node.users:
            step = _step(model, value, user, carried, linear_calls)
            if step is None:
                blocked.append((value.lo, value.hi))
            elif step == "balance":
                if user not in balance:
                    balance.append(user)
                reaching.append((value.lo, value.hi))
            elif isinstance(step, _Value):
                if step.node not in carried:
                    carried[step.node] = (step.lo, step.hi)
                    frontier.append(step)
    if not balance:
        return None
    lo = min(r[0] for r in reaching)
    hi = max(r[1] for r in reaching)
    if any(not (hi <= b_lo or b_hi <= lo) for b_lo, b_hi in blocked):
        return None  # a scaled channel also reaches something the scale cannot pass
    return balance, (lo, hi)


def _step(
    model: torch.nn.Module,
    value: _Value,
    user: fx.Node,
    carried: dict[fx.Node, tuple[int, int]],
    linear_calls: dict[fx.Node, tuple[str, ...]],
) -> _Value | str | None:
    """What ``user`` does with ``value``: ``"balance"`` (a linear layer reads it), the value
    it passes on, ``"ignore"`` (it reads only the shape), or ``None`` (it blocks the scale)."""
    name = _op_name(user)
    if user in linear_calls:
        return "balance" if user.args and user.args[0] is value.node else None
    if name in _READS_SHAPE or (name == "getattr" and user.args[1] in _READS_SHAPE):
        return "ignore"
    if _reads_only_its_shape(user, value.node):
        return "ignore"
    if user.op == "call_module":
        passes = isinstance(model.get_submodule(str(user.target)), torch.nn.Dropout)
        return _Value(user, value.lo, value.hi, value.flat) if passes else None
    if name in _MOVES:
        return _Value(user, value.lo, value.hi, value.flat and name in _KEEPS_SHAPE)
    if name == "getitem":
        return _sliced(value, user)
    if name in ("chunk", "split"):
        return _Value(user, value.lo, value.hi, value.flat) if value.flat else None
    if name in _PRODUCTS:
        others = [a for a in _tensor_args(user) if a is not value.node]
        if any(_overlaps(carried.get(o), value) for o in others) or len(others) != 1:
            return None
        return _Value(user, value.lo, value.hi, value.flat)
    if name in _MATMUL:
        if len(user.args) == 2 and user.args[1] is value.node and user.args[0] not in carried:
            return _Value(user, value.lo, value.hi, False)
        return None
    if name in _ATTENTION:
        query, key = (
            user.args[0] if user.args else None,
            user.args[1] if len(user.args) > 1 else None,
        )
        is_value = (len(user.args) > 2 and user.args[2] is value.node) or (
            user.kwargs.get("value") is value.node
        )
        if is_value and query not in carried and key not in carried:
            return _Value(user, value.lo, value.hi, False)
        return None
    return None


def _sliced(value: _Value, user: fx.Node) -> _Value | None:
    """A ``getitem`` of ``value``: one piece of a chunk or split, a slice of the last
    dimension (narrowing the channels while it is the smooth layer's), or an index over
    other dimensions (a head repeat, a row selection), which keeps them."""
    source, index = user.args[0], user.args[1]
    if isinstance(source, fx.Node) and _op_name(source) in ("chunk", "split"):
        if not value.flat or not isinstance(index, int):
            return None
        pieces = _pieces(source, value.hi - value.lo)
        if pieces is None or index >= len(pieces):
            return None
        lo = value.lo + sum(pieces[:index])
        return _Value(user, lo, lo + pieces[index], True)
    if not isinstance(index, tuple):  # rows (a batch, routed tokens): channels stay last
        return _Value(user, value.lo, value.hi, value.flat)
    last = index[-1] if index else None
    if last is None or last == slice(None):
        return _Value(user, value.lo, value.hi, value.flat and None not in index)
    if Ellipsis not in index or not value.flat:
        return None  # an index whose dimension is not known to be the channels'
    if not isinstance(last, slice) or last.step not in (None, 1):
        return None  # picks single channels
    if not all(b is None or isinstance(b, int) for b in (last.start, last.stop)):
        return None  # bounds computed at run time
    start, stop, _ = last.indices(value.hi - value.lo)
    return _Value(user, value.lo + start, value.lo + stop, True)


def _pieces(node: fx.Node, width: int) -> list[int] | None:
    """The widths a ``chunk`` or ``split`` of the last dimension cuts ``width`` into."""
    dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
    if dim not in (-1,):
        return None
    count = node.args[1] if len(node.args) > 1 else node.kwargs.get("chunks")
    if _op_name(node) == "chunk" and isinstance(count, int) and width % count == 0:
        return [width // count] * count
    sizes = node.args[1] if len(node.args) > 1 else node.kwargs.get("split_size_or_sections")
    if isinstance(sizes, int):
        return [sizes] * (width // sizes) if width % sizes == 0 else None
    if isinstance(sizes, (list, tuple)) and all(isinstance(s, int) for s in sizes):
        return list(sizes)
    return None


def _refusal(
    model: torch.nn.Module,
    smooth_is_linear: bool,
    balance: tuple[str, ...],
    rows: tuple[int, int],
    is_target: Callable[[str], bool],
) -> str | None:
    """Why a pair the graph shows is not smoothed (``None``: it is): no balance layer is
    quantized, or inputs wider than the scaled channels, so that a balance layer reads each
    channel in several columns, where no per-column scale can undo one per channel. From a
    linear layer that is grouped-query attention (each value head repeated for several query
    heads); from a norm, a norm applied per head and the heads laid side by side, or
    positions merged into channels (a vision merger)."""
    if not any(is_target(name) for name in balance):
        return f"{balance[0]} is not quantized"
    width = rows[1] - rows[0]
    for name in balance:
        columns = _in_features(model.get_submodule(name))
        if columns != width:
            why = (
                "repeated heads: grouped-query attention"
                if smooth_is_linear
                else "each channel read in several columns: a norm per head, or merged positions"
            )
            return f"{name} reads {columns} inputs from {width} scaled channels ({why})"
    return None


def _reads_only_its_shape(user: fx.Node, node: fx.Node) -> bool:
    """Whether ``user`` is a statement moved into a recorded call (autowrap) that reads
    ``node`` only for its shape, dtype or device: a size check between ``v_proj`` and
    ``o_proj`` (SpeechT5's ``if attn_output.size() != ...: raise``) blocks no channel."""
    shape_only = getattr(user.target, SHAPE_ONLY, None) if user.op == "call_function" else None
    if not shape_only or node in user.kwargs.values():
        return False
    positions = [i for i, arg in enumerate(user.args) if arg is node]
    return bool(positions) and all(i in shape_only for i in positions)


def _op_name(node: fx.Node) -> str:
    """The operation's own name: a method's, a function's (``operator.mul`` is ``mul``), or a
    called module's class."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        if node.target is operator.getitem:
            return "getitem"
        return getattr(node.target, "__name__", str(node.target))
    return node.op


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    return [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]


def _overlaps(span: tuple[int, int] | None, value: _Value) -> bool:
    return span is not None and not (span[1] <= value.lo or value.hi <= span[0])
