"""Describe how weights (and activations) are quantized, and which modules a scheme applies to.

The fields mirror compressed-tensors' `QuantizationArgs` and `QuantizationScheme`, so that a
checkpoint written from these objects means to vLLM what it meant to us; `checkpoint/` does the
translation. Presets are the four schemes people deploy most: `W4A16` (the default), its
asymmetric variant, `W8A16` and `W8A8`. Per-channel variants come from the same presets::

    >>> W4A16.with_weights(strategy="channel", group_size=None).weights.strategy
    'channel'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from llmc_trace.core.names import module_matches
from llmc_trace.layers.linear import is_linear
from llmc_trace.errors import SchemeError

Strategy = Literal["channel", "group", "tensor"]
Observer = Literal["minmax", "mse"]
ActOrder = Literal["static", "group"]

DEFAULT_TARGETS: tuple[str, ...] = ("Linear",)
"""Every `torch.nn.Linear` (and subclass), and GPT-2's transposed `Conv1D`, is quantized unless
ignored (see `matches`)."""

DEFAULT_IGNORE: tuple[str, ...] = ("lm_head",)
"""Modules kept in full precision by default: `lm_head` produces the logits directly, so its
error is not averaged out by later layers, and llm-compressor and vLLM both leave it
unquantized by convention. A multimodal model's towers and projector are kept too, found from
the model's structure rather than by name (:mod:`llmc_trace.models.parts`).
"""


@dataclass(frozen=True)
class QuantizationArgs:
    """How one tensor is mapped to integers: bit width, symmetry, and which values share a scale.

    `strategy` says which values share a scale: one per `"tensor"`, one per output
    `"channel"` (row), or one per `group_size` consecutive input columns of a row (`"group"`).
    `observer` chooses the clipping range: `"minmax"` uses the full range, `"mse"` searches
    shrink factors of it for the smallest rounding error. `actorder` only changes how GPTQ
    orders its column sweep; see `llmc_trace.algorithms.gptq.gptq` for what each value does.
    """

    num_bits: int = 4
    symmetric: bool = True
    strategy: Strategy = "group"
    group_size: int | None = 128
    observer: Observer = "minmax"
    actorder: ActOrder | None = None

    def __post_init__(self) -> None:
        for field, value, right, kind, hint in (
            ("num_bits", self.num_bits, _whole(self.num_bits), "a whole number",
             "use 2 to 8 bits, e.g. 4."),
            ("symmetric", self.symmetric, isinstance(self.symmetric, bool), "true or false",
             "use true (scales only) or false (scales and zero points)."),
            ("group_size", self.group_size,
             self.group_size is None or _whole(self.group_size), "a whole number or null",
             "use e.g. 128, or null for a per-channel or per-tensor strategy."),
        ):  # fmt: skip
            if not right:
                raise SchemeError(f"{field}={value!r} is not {kind}.", hint=hint)
        for field, value, allowed in (
            ("strategy", self.strategy, get_args(Strategy)),
            ("observer", self.observer, get_args(Observer)),
            ("actorder", self.actorder, (None, *get_args(ActOrder))),
        ):
            if value not in allowed:
                raise SchemeError(
                    f"{field}={value!r} is not supported.",
                    hint=f"use one of {', '.join(map(repr, allowed))}.",
                )
        if not 2 <= self.num_bits <= 8:
            raise SchemeError(
                f"num_bits={self.num_bits} is not supported.",
                hint="use 2 to 8 bits; the packed integer format stores at most 8 bits.",
            )
        if self.strategy == "group":
            if self.group_size is None or self.group_size <= 0:
                raise SchemeError(
                    f"strategy 'group' needs a positive group_size, got {self.group_size}.",
                    hint="pass group_size=128 (or 64, 32), or use strategy='channel'.",
                )
        elif self.group_size is not None:
            raise SchemeError(
                f"group_size={self.group_size} only applies to strategy 'group', "
                f"not {self.strategy!r}.",
                hint="pass group_size=None, or strategy='group'.",
            )
        if self.actorder == "group" and self.strategy != "group":
            raise SchemeError(
                "actorder 'group' permutes the groups of a group-wise scheme, "
                f"but the strategy is {self.strategy!r}.",
                hint="use actorder='static' for per-channel or per-tensor schemes.",
            )

    @property
    def qmin(self) -> int:
        """Smallest integer on the grid: -2^(b-1) (-8 for 4 bits)."""
        return -(1 << (self.num_bits - 1))

    @property
    def qmax(self) -> int:
        """Largest integer on the grid: 2^(b-1) - 1 (7 for 4 bits)."""
        return (1 << (self.num_bits - 1)) - 1


def _whole(value: object) -> bool:
    """An integer, and not a boolean (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DynamicActivationArgs:
    """Input activations quantized at run time, one scale per token, by the inference engine.

    Nothing is calibrated for them: the scheme records them so that the checkpoint tells vLLM
    to run an int8 x int8 matmul (the `int-quantized` format).
    """

    num_bits: int = 8
    symmetric: bool = True


@dataclass(frozen=True)
class QuantizationScheme:
    """A named pairing of weight (and optional activation) quantization with the modules it covers.

    A module is covered when it matches `targets` and does not match `ignore` (see `matches`).
    """

    name: str
    weights: QuantizationArgs
    input_activations: DynamicActivationArgs | None = None
    targets: tuple[str, ...] = DEFAULT_TARGETS
    ignore: tuple[str, ...] = DEFAULT_IGNORE

    def with_weights(self, **changes: object) -> QuantizationScheme:
        """Return a copy whose weight arguments have `changes` applied (validated again)."""
        return dataclasses.replace(self, weights=dataclasses.replace(self.weights, **changes))

    def is_target(self, module_name: str, module: torch.nn.Module) -> bool:
        """Whether this scheme quantizes `module`: it matches a target and no ignore pattern."""
        return matches(module_name, module, self.targets) and not matches(
            module_name, module, self.ignore
        )


# The presets sort GPTQ's sweep by act-order ("static", as llm-compressor's GPTQ does by
# default): it changes nothing in the checkpoint format and cut GPTQ's output error by about
# 40 % over the reference model's 42 layers (W4 group 128, W3 per channel, W2 group 64);
# round-to-nearest ignores it.
W4A16 = QuantizationScheme("W4A16", QuantizationArgs(num_bits=4, actorder="static"))
W4A16_ASYM = QuantizationScheme(
    "W4A16_ASYM", QuantizationArgs(num_bits=4, symmetric=False, actorder="static")
)
W8A16 = QuantizationScheme("W8A16", QuantizationArgs(num_bits=8, actorder="static"))
W8A8 = QuantizationScheme(
    "W8A8",
    QuantizationArgs(num_bits=8, strategy="channel", group_size=None, actorder="static"),
    input_activations=DynamicActivationArgs(),
)

PRESET_SCHEMES: dict[str, QuantizationScheme] = {
    scheme.name: scheme for scheme in (W4A16, W4A16_ASYM, W8A16, W8A8)
}
DEFAULT_SCHEME = W4A16


def resolve_scheme(name: str) -> QuantizationScheme:
    """Return the preset called `name` (case does not matter), e.g. `resolve_scheme("w4a16")`."""
    scheme = PRESET_SCHEMES.get(name.upper())
    if scheme is None:
        raise SchemeError(
            f"unknown quantization scheme {name!r}.",
            hint=f"use one of {', '.join(PRESET_SCHEMES)}.",
            location=name,
        )
    return scheme


def matches(module_name: str, module: torch.nn.Module, patterns: tuple[str, ...]) -> bool:
    """Whether any pattern names `module`.

    A pattern is a class name (`"Linear"` matches `torch.nn.Linear` and every subclass, through
    the MRO), an exact module path (`"lm_head"`), or `"re:"` followed by a regular expression
    matched from the start of the module path (`"re:.*vision_tower.*"`). These are the rules
    compressed-tensors and vLLM apply when they read `targets` and `ignore` back from a
    checkpoint, so a pattern means the same thing here and at load time.

    One addition: `"Linear"` also matches transformers' `Conv1D` (GPT-2's layers, a Linear with
    its weight transposed), so the default targets compress GPT-2 as they compress Llama. vLLM
    agrees: it builds those layers as its own `*ParallelLinear` classes, which its
    compressed-tensors config matches to `"Linear"` by class name. compressed-tensors does not
    (it quantizes no `Conv1D`); `llmc_trace.checkpoint.layout.stores_quantized` says what the
    checkpoint does about that.
    """
    return any(
        module_matches(pattern, module_name, module) or (pattern == "Linear" and is_linear(module))
        for pattern in patterns
    )
