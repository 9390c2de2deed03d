"""Describe how weights (and activations) are quantized, and which modules a scheme applies to.

The fields mirror compressed-tensors' `QuantizationArgs` and `QuantizationScheme`, so that a
checkpoint written from these objects means to vLLM what it meant to us; `checkpoint/` does the
translation. The presets are compressed-tensors' own (`PRESET_SCHEMES` of the installed
version, read by `preset_scheme`): integer grids (W4A16, W8A8, W4A8, ...),
FP8 (per tensor, per channel, per 128x128 block), NVFP4 and the MX formats. Per-channel
variants come from the same presets::

    >>> from llmc_trace.algorithms.scheme import W4A16
    >>> W4A16.with_weights(strategy="channel", group_size=None).weights.strategy
    'channel'
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from llmc_trace.core.names import module_matches
from llmc_trace.layers.linear import is_linear
from llmc_trace.errors import SchemeError

Strategy = Literal["channel", "group", "tensor", "block", "tensor_group"]
Observer = Literal["minmax", "mse"]
ActOrder = Literal["static", "group"]
QuantType = Literal["int", "float"]
ScaleDtype = Literal["float8_e4m3fn", "uint8"]

FLOAT_MAX: dict[int, float] = {8: 448.0, 6: 7.5, 4: 6.0}
"""Largest value of each float element format: FP8 E4M3, FP6 E2M3, FP4 E2M1."""

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
    """How one tensor is mapped to its grid: bit width, element type, symmetry, and which values
    share a scale.

    `type` `"int"` maps to integers; `"float"` to the values of a small float format (FP8
    E4M3, FP6 E2M3 or FP4 E2M1 for 8, 6 or 4 bits), always symmetric. `strategy` says which
    values share a scale: one per `"tensor"`, one per output `"channel"` (row), one per
    `group_size` consecutive input columns of a row (`"group"`), one per `block_structure`
    (rows, columns) tile (`"block"`), or per group under one per-tensor global scale
    (`"tensor_group"`, NVFP4's). `scale_dtype` is how scales are stored when not in the model's
    dtype: `"float8_e4m3fn"` (NVFP4) or `"uint8"`, a power-of-two exponent (the MX formats).
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
    type: QuantType = "int"
    block_structure: tuple[int, int] | None = None
    scale_dtype: ScaleDtype | None = None

    def __post_init__(self) -> None:
        if isinstance(self.block_structure, list):  # as a recipe spells it
            object.__setattr__(self, "block_structure", tuple(self.block_structure))
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
            ("type", self.type, get_args(QuantType)),
            ("scale_dtype", self.scale_dtype, (None, *get_args(ScaleDtype))),
        ):
            if value not in allowed:
                raise SchemeError(
                    f"{field}={value!r} is not supported.",
                    hint=f"use one of {', '.join(map(repr, allowed))}.",
                )
        if self.type == "float":
            self._check_float()
        elif not 2 <= self.num_bits <= 8:
            raise SchemeError(
                f"num_bits={self.num_bits} is not supported.",
                hint="use 2 to 8 bits; the packed integer format stores at most 8 bits.",
            )
        elif self.strategy == "tensor_group" or self.scale_dtype is not None:
            raise SchemeError(
                "a per-tensor global scale and fp8 or exponent scales belong to float grids.",
                hint="use type='float', or strategy 'group' with scale_dtype=None.",
            )
        if self.strategy == "block":
            structure = self.block_structure
            if (
                not isinstance(structure, tuple)
                or len(structure) != 2
                or not all(_whole(side) and side > 0 for side in structure)
            ):
                raise SchemeError(
                    f"strategy 'block' needs block_structure=[rows, columns], got {structure!r}.",
                    hint="use block_structure=[128, 128], as FP8_BLOCK does.",
                )
        elif self.block_structure is not None:
            raise SchemeError(
                f"block_structure only applies to strategy 'block', not {self.strategy!r}.",
                hint="pass block_structure=None, or strategy='block'.",
            )
        if self.strategy in ("group", "tensor_group"):
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
        if self.actorder == "group" and (self.strategy != "group" or self.type == "float"):
            raise SchemeError(
                "actorder 'group' permutes the groups of an integer group-wise scheme, "
                f"but the grid is {self.type} {self.strategy!r}.",
                hint="use actorder='static', which keeps the groups in input order.",
            )

    def _check_float(self) -> None:
        """The float grids a compressed-tensors compressor can store."""
        if self.num_bits not in FLOAT_MAX:
            raise SchemeError(
                f"float grids have 4, 6 or 8 bits (FP4, FP6, FP8), not {self.num_bits}.",
                hint="use num_bits=8 (FP8 E4M3) or 4 (FP4 E2M1).",
            )
        if not self.symmetric:
            raise SchemeError(
                "float grids are symmetric (compressed-tensors stores no zero point for them).",
                hint="use symmetric=true.",
            )
        mx = self.scale_dtype == "uint8"
        if mx != (self.strategy == "group" and self.group_size == 32):
            raise SchemeError(
                "a float grid's groups of 32 are the MX formats, which store power-of-two "
                "scales (scale_dtype 'uint8'), and only they do.",
                hint="use a preset: MXFP4A16, MXFP8A16, NVFP4A16, FP8_DYNAMIC or FP8_BLOCK.",
            )
        nvfp4 = self.strategy == "tensor_group"
        if nvfp4 != (self.num_bits == 4 and not mx) or (
            nvfp4 and (self.group_size != 16 or self.scale_dtype != "float8_e4m3fn")
        ):
            raise SchemeError(
                "FP4 outside the MX formats is NVFP4: groups of 16 with fp8 scales under a "
                "per-tensor global scale (strategy 'tensor_group'), and nothing else is.",
                hint="use the NVFP4A16 or MXFP4A16 preset.",
            )
        if self.num_bits == 6 and not mx:
            raise SchemeError("FP6 is stored only as MXFP6.", hint="use the MXFP6A16 preset.")

    @property
    def is_float(self) -> bool:
        return self.type == "float"

    @property
    def qmin(self) -> float:
        """Smallest value on the grid: -2^(b-1) for integers (-8 for 4 bits), -max for floats."""
        if self.is_float:
            return -FLOAT_MAX[self.num_bits]
        return -(1 << (self.num_bits - 1))

    @property
    def qmax(self) -> float:
        """Largest value on the grid: 2^(b-1) - 1 for integers (7 for 4 bits), the float
        format's largest value (448 for FP8 E4M3, 6 for FP4 E2M1)."""
        if self.is_float:
            return FLOAT_MAX[self.num_bits]
        return (1 << (self.num_bits - 1)) - 1


def _whole(value: object) -> bool:
    """An integer, and not a boolean (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


ActivationStrategy = Literal["token", "tensor", "group", "tensor_group"]


@dataclass(frozen=True)
class ActivationArgs:
    """How the inference engine quantizes a layer's input activations: integers or a float
    format, with scales per token, per tensor or per group.

    `dynamic=True`: every scale is computed at run time from the activations themselves, so
    nothing is calibrated. `dynamic=False` (a static scale per tensor, FP8's) and `"local"`
    (group scales at run time under a static global scale, NVFP4's) need scales observed on
    calibration data, with `observer` (compressed-tensors' `static_minmax`): the checkpoint
    stores them as `input_scale` or `input_global_scale`.
    """

    num_bits: int = 8
    symmetric: bool = True
    type: QuantType = "int"
    strategy: ActivationStrategy = "token"
    group_size: int | None = None
    dynamic: bool | Literal["local"] = True
    observer: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in get_args(ActivationStrategy):
            raise SchemeError(
                f"activation strategy {self.strategy!r} is not supported.",
                hint=f"use one of {', '.join(map(repr, get_args(ActivationStrategy)))}.",
            )
        if self.dynamic not in (True, False, "local"):
            raise SchemeError(
                f"activations' dynamic={self.dynamic!r} is not true, false or 'local'.",
                hint="use true: scales computed per token at run time.",
            )

    @property
    def calibrated(self) -> bool:
        """Whether a scale must be observed on calibration data (static, or a static global
        scale under dynamic groups)."""
        return self.dynamic is not True


@dataclass(frozen=True)
class QuantizationScheme:
    """A named pairing of weight (and optional activation) quantization with the modules it covers.

    A module is covered when it matches `targets` and does not match `ignore` (see `matches`).
    """

    name: str
    weights: QuantizationArgs
    input_activations: ActivationArgs | None = None
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


DEFAULT_ACTORDER: ActOrder = "static"
"""The one default the project adds to compressed-tensors' presets: GPTQ sweeps columns by
act-order ("static", as llm-compressor's GPTQ does by default). It changes nothing in the
checkpoint format and cut GPTQ's output error by about 40 % over the reference model's 42
layers (W4 group 128, W3 per channel, W2 group 64); round-to-nearest ignores it."""


@functools.cache
def preset_names() -> tuple[str, ...]:
    """compressed-tensors' presets that quantize weights, in its order (UNQUANTIZED, which
    quantizes nothing, is not one)."""
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    return tuple(name for name, preset in PRESET_SCHEMES.items() if preset.get("weights"))


@functools.cache
def preset_scheme(name: str) -> QuantizationScheme:
    """compressed-tensors' preset `name` as a scheme, read from the installed version's
    `PRESET_SCHEMES` (one definition), with `DEFAULT_ACTORDER` added."""
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    preset = PRESET_SCHEMES[name]
    weights = preset["weights"]
    activations = preset.get("input_activations")
    return QuantizationScheme(
        name,
        QuantizationArgs(
            num_bits=weights.num_bits,
            symmetric=weights.symmetric,
            strategy=_value(weights.strategy),
            group_size=weights.group_size,
            actorder=_value(weights.actorder) or DEFAULT_ACTORDER,
            type=_value(weights.type),
            block_structure=tuple(weights.block_structure) if weights.block_structure else None,
            scale_dtype=_dtype_name(weights.scale_dtype),
        ),
        None
        if activations is None
        else ActivationArgs(
            num_bits=activations.num_bits,
            symmetric=activations.symmetric,
            type=_value(activations.type),
            strategy=_value(activations.strategy),
            group_size=activations.group_size,
            dynamic=_value(activations.dynamic),
            observer=activations.observer,
        ),
    )


def _value(field: object) -> Any:
    """An enum member of compressed-tensors' arguments as its plain value."""
    return getattr(field, "value", field)


def _dtype_name(dtype: torch.dtype | None) -> Any:
    return None if dtype is None else str(dtype).removeprefix("torch.")


PRESET_NAMES: tuple[str, ...]
"""Every compressed-tensors preset that quantizes, by the installed version's names."""
W4A16: QuantizationScheme
W4A16_ASYM: QuantizationScheme
W8A16: QuantizationScheme
W8A8: QuantizationScheme
DEFAULT_SCHEME: QuantizationScheme

#: The module's preset names and the compressed-tensors preset each is.
_PRESET_ATTRIBUTES = {
    **{name: name for name in ("W4A16", "W4A16_ASYM", "W8A16", "W8A8")},
    "DEFAULT_SCHEME": "W4A16",
}
#: The names :func:`__getattr__` reads from compressed-tensors (the package re-exports them).
LAZY_NAMES = frozenset({"PRESET_NAMES", *_PRESET_ATTRIBUTES})


def __getattr__(name: str) -> Any:
    """The presets above, read from compressed-tensors when one is first used (PEP 562):
    compressed-tensors imports transformers (seconds on two cores), which the algorithms on
    their own never need (a rank accumulating Hessians, a process sweeping a kernel)."""
    if name == "PRESET_NAMES":
        value: Any = preset_names()
    elif name in _PRESET_ATTRIBUTES:
        value = preset_scheme(_PRESET_ATTRIBUTES[name])
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def resolve_scheme(name: str) -> QuantizationScheme:
    """Return the preset called `name` (case does not matter), e.g. `resolve_scheme("w4a16")`,
    with the project's one default (`DEFAULT_ACTORDER`)."""
    if name.upper() not in preset_names():
        runnable = [n for n in preset_names() if not _static_activations(preset_scheme(n))]
        raise SchemeError(
            f"unknown quantization scheme {name!r}.",
            hint=f"Use one of compressed-tensors' presets: {', '.join(runnable)} (those "
            "whose activation scales are static, observed on calibration data, are not run "
            "here).",
            location=name,
        )
    return preset_scheme(name.upper())


def _static_activations(scheme: QuantizationScheme) -> bool:
    activations = scheme.input_activations
    return activations is not None and activations.calibrated


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
