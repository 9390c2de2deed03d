"""Record chosen functions and methods as single graph calls instead of tracing into them.

Mask builders are the classic case: they branch on attention-mask *values* and use ``vmap``,
yet their result only feeds attention. Recorded as one ``call_function`` node, such a helper
runs for real at calibration time with whatever batch arrives, and its code never meets a
proxy. The reference tool keeps a hand-written list of mask-function names that broke when
transformers renamed one; we discover them from ``transformers.masking_utils`` at run time.

Names are matched as written by the user:

* ``create_causal_mask``: a module-level function, patched in the globals of every module file
  the trace passes through;
* ``Qwen2VLModel.get_rope_index`` or ``get_rope_index``: a method, patched on the module
  instances (never on the class, so other models in the process are untouched).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import sys
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import torch

from llmc_trace.tracing.rebuild import GraphTarget

#: transformers module whose mask builders are opaque by default.
MASKING_MODULE = "transformers.masking_utils"
#: Validation helpers recorded as calls, so their checks run on real data at calibration time
#: instead of failing on a proxy while tracing.
CHECK_FUNCTIONS = ("torch_compilable_check",)


#: torch constructors whose size arguments may be proxies (``torch.ones(batch, seq)``): the
#: argument parser would otherwise read a proxy as a size *sequence* and reject the call.
CONSTRUCTORS = (
    "ones",
    "zeros",
    "full",
    "empty",
    "eye",
    "tensor",
    "arange",
    "linspace",
    "ones_like",
    "zeros_like",
    "full_like",
    "empty_like",
    "tril",
    "triu",
    "finfo",
)


#: torch functions that draw random numbers: recorded as graph calls whatever their arguments,
#: so that each batch draws its own (a draw baked into the graph as a constant would repeat
#: the trace's numbers on every batch, where eager code draws new ones).
RANDOM_FUNCTIONS = (
    "rand",
    "randn",
    "randint",
    "randperm",
    "rand_like",
    "randn_like",
    "randint_like",
    "normal",
    "bernoulli",
    "multinomial",
    "poisson",
)
#: Methods of ``torch.distributions`` classes that draw: PI0 samples its flow-matching time
#: from a ``Beta``, whose sampler runs inside an autograd ``Function`` no proxy may enter.
DRAWING_METHODS = ("sample", "rsample")


#: How a draw reaches the tracer: the original function, its arguments, and for a
#: distribution's method the method's name (the distribution is the first argument).
RecordDraw = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], "str | None"], Any]


@contextlib.contextmanager
def patch_random_draws(record_draw: RecordDraw) -> Iterator[None]:
    """Send every random draw, a torch function's or a distribution's, to ``record_draw``,
    for one trace."""
    patched: list[tuple[Any, str, Any]] = []
    for name in RANDOM_FUNCTIONS:
        if hasattr(torch, name):
            patched.append((torch, name, getattr(torch, name)))
    for cls in vars(torch.distributions).values():
        if inspect.isclass(cls) and issubclass(cls, torch.distributions.Distribution):
            patched.extend(
                (cls, name, vars(cls)[name]) for name in DRAWING_METHODS if name in vars(cls)
            )
    try:
        for owner, name, original in patched:
            method = name if owner is not torch else None
            setattr(owner, name, _draw_wrapper(original, record_draw, method))
        yield
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)


def draw_from(distribution: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """Graph target for a distribution's draw: ``distribution.method(*args, **kwargs)``."""
    return getattr(distribution, method)(*args, **kwargs)


def _draw_wrapper(
    original: Callable[..., Any], record_draw: RecordDraw, method: str | None
) -> Callable[..., Any]:
    @functools.wraps(original, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return record_draw(original, args, kwargs, method)

    return wrapper


@contextlib.contextmanager
def patch_constructors(
    record_function: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    has_proxy: Callable[[Any], bool],
) -> Iterator[None]:
    """Record torch constructors called with proxies as graph calls, for one trace."""
    originals = {name: getattr(torch, name) for name in CONSTRUCTORS if hasattr(torch, name)}
    try:
        for name, original in originals.items():
            setattr(torch, name, _function_wrapper(original, record_function, has_proxy))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)


def call_module_method(module: torch.nn.Module, method_name: str, *args: Any, **kwargs: Any) -> Any:
    """Graph target for an opaque method: ``module.method_name(*args, **kwargs)`` at run time."""
    return getattr(module, method_name)(*args, **kwargs)


def default_opaque_functions() -> list[str]:
    """The mask builders that ``transformers.masking_utils`` defines, found by inspection.

    Builders are the functions named ``create_*`` or ``*_mask``; the ``*_mask_function``
    combinators they use only ever see plain Python values.
    """
    try:
        masking = __import__(MASKING_MODULE, fromlist=["_"])
    except ImportError:
        return []
    names = []
    for name, value in vars(masking).items():
        if (
            inspect.isfunction(value)
            and value.__module__ == MASKING_MODULE
            and (name.startswith("create_") or name.endswith("_mask"))
        ):
            names.append(name)
    return sorted(names) + list(CHECK_FUNCTIONS)


#: The helpers with which ``transformers.masking_utils`` decides that no mask is needed (sdpa's
#: causal attention passes ``is_causal`` instead; bidirectional or recurrent layers without
#: padding need nothing), each with the answer that makes it build the mask: the skip tests
#: say no, and ``is_tracing`` says yes (the builders never skip on what they cannot see).
MASK_SKIP_TESTS = {
    "_ignore_causal_mask_sdpa": False,
    "_ignore_bidirectional_mask_sdpa": False,
    "is_tracing": True,
}


def skipped_mask_reaches_traced_code(graph: torch.fx.Graph) -> bool:
    """A mask builder returned ``None`` (or a dict holding one) for the example, and traced
    code, not only leaves, used that ``None``.

    sdpa's builders return ``None`` when the batch has no padding, so attention can pass
    ``is_causal=True`` instead of a mask: a fact about the batch, not the model. Handed to a
    leaf (a decoder layer), the result is decided again for each batch, by eager code. But
    when the attention code itself is traced (``sequential_targets=["Linear"]``), its
    ``attention_mask is None`` met a proxy, which is never ``None``: the graph would run
    non-causal attention without a mask. Such a trace must be redone with explicit masks.
    """

    def used_as_none(node: torch.fx.Node, value: Any) -> bool:
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem:
                key = user.args[1]
                inner = value.get(key) if isinstance(value, dict) else None
                if isinstance(value, (list, tuple)) and isinstance(key, int):
                    inner = value[key]
                if used_as_none(user, inner):
                    return True
            elif value is None and user.op != "call_module":
                return True
        return False

    return any(
        node.op == "call_function"
        and getattr(node.target, "__module__", None) == MASKING_MODULE
        and used_as_none(node, node.meta.get("val", False))
        for node in graph.nodes
    )


class ExplicitMasks(GraphTarget):
    """Graph target: a mask builder that always builds its mask (never ``None``).

    For the traces :func:`skipped_mask_reaches_traced_code` finds: the builder runs with
    ``masking_utils``' "no mask needed" tests answering no (:data:`MASK_SKIP_TESTS`), for the
    duration of the call. The mask equals what ``is_causal`` (or no mask) computes, so
    attention is unchanged.
    """

    def __init__(self, builder: Callable[..., Any]) -> None:
        super().__init__(f"explicit_{builder.__name__}")
        self.builder = builder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        masking = sys.modules[MASKING_MODULE]
        saved = {name: getattr(masking, name) for name in MASK_SKIP_TESTS if hasattr(masking, name)}
        try:
            for name in saved:
                setattr(masking, name, functools.partial(_answer, MASK_SKIP_TESTS[name]))
            return self.builder(*args, **kwargs)
        finally:
            for name, test in saved.items():
                setattr(masking, name, test)


def _answer(answer: bool, *args: Any, **kwargs: Any) -> bool:
    return answer


def module_files(modules: Iterable[torch.nn.Module]) -> list[ModuleType]:
    """The Python modules (files) defining the classes of ``modules`` and their bases."""
    seen: dict[str, ModuleType] = {}
    for module in modules:
        for cls in type(module).__mro__:
            python_module = sys.modules.get(cls.__module__)
            if python_module is not None and cls.__module__ not in seen:
                seen[cls.__module__] = python_module
    masking = sys.modules.get(MASKING_MODULE)
    if masking is not None:
        seen.setdefault(MASKING_MODULE, masking)
    return [seen[key] for key in sorted(seen)]


@contextlib.contextmanager
def patch_opaque(
    names: Iterable[str],
    traced_modules: list[tuple[str, torch.nn.Module]],
    record_function: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    record_method: Callable[[torch.nn.Module, str, tuple[Any, ...], dict[str, Any]], Any],
    has_proxy: Callable[[Any], bool],
) -> Iterator[dict[str, list[str]]]:
    """Patch the named functions and methods for the duration of a trace.

    ``record_function``/``record_method`` emit the graph node when a call receives a proxy;
    calls without proxies (value computation, code outside the trace) run the original.
    Yields ``{name: [where it was patched]}`` so a report can say which names matched.
    """
    patched: list[tuple[Any, str, Any, str]] = []  # (owner, attribute, original, kind of owner)
    matched: dict[str, list[str]] = {}
    files = module_files(module for _, module in traced_modules)
    try:
        for name in names:
            class_name, _, attr = name.rpartition(".")
            where: list[str] = []
            if not class_name:
                for python_module in files:
                    original = vars(python_module).get(attr)
                    if inspect.isfunction(original) and not getattr(
                        original, "_llmc_opaque", False
                    ):
                        wrapper = _function_wrapper(original, record_function, has_proxy)
                        patched.append((python_module, attr, original, "module"))
                        setattr(python_module, attr, wrapper)
                        where.append(f"{python_module.__name__}.{attr}")
                for registry, key, original in registered_attention(attr):
                    wrapper = _function_wrapper(original, record_function, has_proxy)
                    patched.append((registry, key, None, "registry"))
                    registry._local_mapping[key] = wrapper
                    where.append(f"ALL_ATTENTION_FUNCTIONS[{key!r}]")
            for path, module in traced_modules:
                if class_name and class_name not in {cls.__name__ for cls in type(module).__mro__}:
                    continue
                if inspect.ismethod(getattr(module, attr, None)) and attr not in vars(module):
                    wrapper = _method_wrapper(module, attr, record_method, has_proxy)
                    patched.append((module, attr, None, "instance"))
                    object.__setattr__(module, attr, wrapper)
                    where.append(f"{path or '<root>'}.{attr}")
            matched[name] = where
        yield matched
    finally:
        for owner, attr, original, kind in reversed(patched):
            if kind == "instance":
                del owner.__dict__[attr]
            elif kind == "registry":
                del owner._local_mapping[attr]
            else:
                setattr(owner, attr, original)


def registered_attention(name: str) -> list[tuple[Any, str, Callable[..., Any]]]:
    """``(registry, key, function)`` for each attention function transformers registered
    under ``name`` (``sdpa_attention_forward``): model code looks these up in
    ``ALL_ATTENTION_FUNCTIONS`` by the config's implementation, never through a module global,
    so making one opaque means overriding its entry (on the registry instance, for this trace)."""
    utils = sys.modules.get("transformers.modeling_utils")
    registry = getattr(utils, "ALL_ATTENTION_FUNCTIONS", None)
    mapping = getattr(registry, "_global_mapping", None)
    if not isinstance(mapping, dict) or not isinstance(
        getattr(registry, "_local_mapping", None), dict
    ):
        return []
    return [
        (registry, key, function)
        for key, function in mapping.items()
        if getattr(function, "__name__", None) == name and key not in registry._local_mapping
    ]


def _function_wrapper(
    original: Callable[..., Any],
    record: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    has_proxy: Callable[[Any], bool],
) -> Callable[..., Any]:
    @functools.wraps(original, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if has_proxy((args, kwargs)):
            return record(original, args, kwargs)
        return original(*args, **kwargs)

    wrapper._llmc_opaque = True  # type: ignore[attr-defined]
    return wrapper


def _method_wrapper(
    module: torch.nn.Module,
    attr: str,
    record: Callable[[torch.nn.Module, str, tuple[Any, ...], dict[str, Any]], Any],
    has_proxy: Callable[[Any], bool],
) -> Callable[..., Any]:
    bound = getattr(type(module), attr).__get__(module)

    @functools.wraps(bound)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if has_proxy((args, kwargs)):
            return record(module, attr, args, kwargs)
        return bound(*args, **kwargs)

    return wrapper
