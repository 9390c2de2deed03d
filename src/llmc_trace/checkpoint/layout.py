"""Translate quantized modules and schemes into compressed-tensors' tensors and `quantization_config`.

Tensors per quantized Linear `P` (as compressed-tensors writes them, and vLLM reads them):

| format | tensor | dtype | shape |
|---|---|---|---|
| `pack-quantized` (weight-only, 2-8 bits) | `P.weight_packed` | int32 | (out, ceil(in * b / 32)) |
| | `P.weight_scale` | model dtype | (out, in / group), (out, 1) per channel, (1,) per tensor |
| | `P.weight_shape` | int64 | (2,) = (out, in) |
| | `P.weight_zero_point`, asymmetric only | int32 | (ceil(out * b / 32), groups), packed along dim 0 |
| `int-quantized` (integer weights, quantized activations) | `P.weight` | int8 | (out, in) |
| | `P.weight_scale` | model dtype | (out, 1), or (out, in / group) |
| | `P.weight_zero_point`, asymmetric only | int8 | (out, 1) |
| `float-quantized` (FP8, with activations) | `P.weight` | float8_e4m3fn | (out, in) |
| | `P.weight_scale` | model dtype | (1,), (out, 1), or (out / 128, in / 128) per block |
| `mxfp8-quantized` | `P.weight` | float8_e4m3fn | (out, in) |
| | `P.weight_scale` | uint8 (E8M0 exponent) | (out, in / 32) |
| `nvfp4-pack-quantized` | `P.weight_packed` | uint8 (two FP4 E2M1) | (out, in / 2) |
| | `P.weight_scale` | float8_e4m3fn | (out, in / 16) |
| | `P.weight_global_scale` | float32 | (1,) |
| `mxfp4-pack-quantized` | `P.weight_packed` | uint8 (two FP4 E2M1) | (out, in / 2) |
| | `P.weight_scale` | uint8 (E8M0 exponent) | (out, in / 32) |
| `mxfp6-pack-quantized` | `P.weight_packed` | uint8 (four FP6 E2M3 in three) | (out, 3 in / 4) |
| | `P.weight_scale` | uint8 (E8M0 exponent) | (out, in / 32) |

Which format a scheme takes is compressed-tensors' own choice (`infer_module_format`), and the
bits are packed by its helpers. Symmetric schemes store no zero point: vLLM does not load one
for them. The config entries are built with compressed-tensors' own pydantic models, so their
keys and defaults are exactly those of the installed version. Only a `torch.nn.Linear` is
stored this way (`stores_quantized`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import compressed_tensors
import torch
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.compressors.mx_utils import compress_mx_scale
from compressed_tensors.compressors.mxfp6.helpers import pack_fp6_to_uint8
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
from compressed_tensors.config import DenseSparsityConfig
from compressed_tensors.quantization import QuantizationArgs as CtQuantizationArgs
from compressed_tensors.quantization import QuantizationConfig as CtQuantizationConfig
from compressed_tensors.quantization import QuantizationScheme as CtQuantizationScheme

from llmc_trace.algorithms.formats import ct_weight_args
from llmc_trace.checkpoint.pack import pack_to_int32
from llmc_trace.moe import ExpertProjection
from llmc_trace.core.sizes import TensorSpec
from llmc_trace.algorithms.quantize import QuantizedWeight
from llmc_trace.algorithms.scheme import QuantizationScheme, matches
from llmc_trace.algorithms.sparsegpt import Sparsity

PACKED_FLOAT = {"nvfp4-pack-quantized": 2, "mxfp4-pack-quantized": 2, "mxfp6-pack-quantized": 4 / 3}
"""The formats that pack a float grid's values into uint8 bytes, with values per byte."""


def stores_quantized(module: torch.nn.Module) -> bool:
    """Whether a compressed module's weight is stored as integers and scales; if not, it is
    stored dense: the weight the compression left, in the module's own layout and the
    checkpoint's dtype, with the module named in `ignore`.

    Only a `torch.nn.Linear` (or subclass) is stored quantized, because no loader can read any
    other module quantized. compressed-tensors (0.20) sets up quantized weights for `Linear` and
    `Embedding` modules alone (`apply_quantization_config`, `quantization/lifecycle/apply.py`
    line 175; `initialize_module_for_quantization`, `initialize.py` lines 85-127), so
    transformers would leave a GPT-2 `Conv1D`'s `weight_packed` unused and its `weight`
    randomly initialised, with a load report but no error; loaded with `dequantize=True` it
    decompresses the tensors to an `(out, in)` weight and refuses it for the `Conv1D`'s
    `(in, out)` one (or, for a square layer, loads it transposed). vLLM alone would read the
    integers: its GPT-2 transposes only tensors named `.weight` at load. Stored dense, a
    compressed `Conv1D` loads in both with its compressed values, and saves no memory.

    One expert's projection of fused MoE weights (:mod:`llmc_trace.moe`) is stored
    quantized, one set of tensors per expert and projection, where the architecture's published
    checkpoints store experts one by one: transformers then decompresses and joins them at load
    (its compressed-tensors integration handles experts), and vLLM reads them per expert. Where
    they are published fused (gpt-oss, Gemma 4), no loader reads per-expert integers, and the
    fused parameter is stored dense with the compressed values.
    """
    return isinstance(module, torch.nn.Linear) or (
        isinstance(module, ExpertProjection) and module.stored_per_expert
    )


def format_of(scheme: QuantizationScheme) -> str:
    """The compressed-tensors format a scheme is stored in, as compressed-tensors chooses it
    for a Linear (`infer_module_format`): integer weights with quantized input activations are
    `int-quantized` (int8 weights, so vLLM can run an integer matmul), weight-only integer
    schemes `pack-quantized`, FP8 with activations `float-quantized`, NVFP4 and the MX formats
    their own."""
    return str(infer_module_format(torch.nn.Linear, _ct_scheme(scheme, None)).value)


def module_tensors(
    prefix: str, quantized: QuantizedWeight, scheme: QuantizationScheme
) -> dict[str, torch.Tensor]:
    """The checkpoint tensors replacing `{prefix}.weight` for one quantized module."""
    args = quantized.args
    form = format_of(scheme)
    tensors = {f"{prefix}.weight_scale": quantized.scale}
    if form in PACKED_FLOAT:
        pack = pack_fp6_to_uint8 if args.num_bits == 6 else pack_fp4_to_uint8
        tensors[f"{prefix}.weight_packed"] = pack(quantized.int_weight.float())
    elif not args.is_float and form == "pack-quantized":
        tensors[f"{prefix}.weight_packed"] = pack_to_int32(quantized.int_weight, args.num_bits)
        tensors[f"{prefix}.weight_shape"] = torch.tensor(quantized.int_weight.shape)
        if not args.symmetric:
            zero_point = quantized.zero_point.reshape(quantized.int_weight.shape[0], -1)
            tensors[f"{prefix}.weight_zero_point"] = pack_to_int32(
                zero_point, args.num_bits, packed_dim=0
            )
    else:
        tensors[f"{prefix}.weight"] = quantized.int_weight
        if not args.symmetric:
            tensors[f"{prefix}.weight_zero_point"] = quantized.zero_point
    if args.scale_dtype == "uint8":  # MX: the power-of-two scale's biased exponent
        tensors[f"{prefix}.weight_scale"] = compress_mx_scale(quantized.scale, torch.uint8)
    elif args.scale_dtype is not None:
        tensors[f"{prefix}.weight_scale"] = quantized.scale.to(getattr(torch, args.scale_dtype))
    if quantized.global_scale is not None:
        tensors[f"{prefix}.weight_global_scale"] = quantized.global_scale
    return {name: tensor.contiguous() for name, tensor in tensors.items()}


def module_tensor_specs(
    prefix: str, shape: tuple[int, ...], scheme: QuantizationScheme, dtype: torch.dtype
) -> dict[str, TensorSpec]:
    """What :func:`module_tensors` will return for a weight of ``shape`` in a ``dtype``
    checkpoint, known before the weight is quantized (the writer plans its shards from it)."""
    args = scheme.weights
    form = format_of(scheme)
    rows, cols = shape
    groups = {"group": -(-cols // (args.group_size or cols)), "channel": 1}.get(args.strategy)
    groups = -(-cols // (args.group_size or cols)) if args.strategy == "tensor_group" else groups
    scale_shape = (rows, groups) if groups is not None else (1,)
    if args.strategy == "block":
        assert args.block_structure is not None
        bh, bw = args.block_structure
        scale_shape = (-(-rows // bh), -(-cols // bw))
    scale_dtype = getattr(torch, args.scale_dtype) if args.scale_dtype else dtype
    specs = {f"{prefix}.weight_scale": TensorSpec(scale_dtype, scale_shape)}
    if form in PACKED_FLOAT:
        specs[f"{prefix}.weight_packed"] = TensorSpec(
            torch.uint8, (rows, int(cols / PACKED_FLOAT[form]))
        )
    elif not args.is_float and form == "pack-quantized":
        specs[f"{prefix}.weight_packed"] = TensorSpec(
            torch.int32, (rows, -(-cols * args.num_bits // 32))
        )
        specs[f"{prefix}.weight_shape"] = TensorSpec(torch.int64, (2,))
        if not args.symmetric:
            specs[f"{prefix}.weight_zero_point"] = TensorSpec(
                torch.int32, (-(-rows * args.num_bits // 32), groups or 1)
            )
    else:
        code = torch.float8_e4m3fn if args.is_float else torch.int8
        specs[f"{prefix}.weight"] = TensorSpec(code, (rows, cols))
        if not args.symmetric:
            specs[f"{prefix}.weight_zero_point"] = TensorSpec(torch.int8, scale_shape)
    if args.strategy == "tensor_group":
        specs[f"{prefix}.weight_global_scale"] = TensorSpec(torch.float32, (1,))
    return specs


def _ct_scheme(scheme: QuantizationScheme, form: str | None = "") -> CtQuantizationScheme:
    """Our scheme as compressed-tensors' `QuantizationScheme` (a config group); `form` the
    format to record ("": the scheme's own; None: none, to ask compressed-tensors for it)."""
    activations = scheme.input_activations
    return CtQuantizationScheme(
        targets=list(scheme.targets),
        weights=ct_weight_args(scheme.weights),
        input_activations=None
        if activations is None
        else CtQuantizationArgs(
            num_bits=activations.num_bits,
            type=activations.type,
            symmetric=activations.symmetric,
            strategy=activations.strategy,
            group_size=activations.group_size,
            dynamic=activations.dynamic,
            observer=activations.observer,
        ),
        format=format_of(scheme) if form == "" else form,
    )


def sparsity_structure(sparsity: Sparsity) -> str:
    """compressed-tensors' name for a sparsity structure: "2:4", or "unstructured"."""
    return f"{sparsity[0]}:{sparsity[1]}" if isinstance(sparsity, tuple) else "unstructured"


def quantization_config(
    schemes: Sequence[QuantizationScheme],
    ignore: Sequence[str],
    sparsity: tuple[Sparsity, float] | None,
) -> dict[str, Any]:
    """The `quantization_config` entry of config.json, as compressed-tensors' `update_config`
    writes it: one config group per scheme used, `ignore` listing every targeted module left in
    full precision, `quantization_status` "compressed", and the installed version.

    `sparsity` is (structure, measured global sparsity) when weights were pruned. It is stated in
    a `dense` sparsity config whose `targets` are deliberately null: the weights are stored
    dense, because neither compressed-tensors (> 0.14) nor vLLM load a sparse format any more
    (vLLM PR #36799 removed the 2:4 kernels), and vLLM releases since then (0.24 and 0.26 at
    least) refuse any sparsity config that names targets, even a dense one (vLLM issue #51188).
    A 2:4 model therefore runs in vLLM today as a dense model: its zeros save neither memory
    nor time.
    """
    formats = sorted({format_of(scheme) for scheme in schemes})
    config = CtQuantizationConfig(
        config_groups={f"group_{i}": _ct_scheme(scheme) for i, scheme in enumerate(schemes)},
        format=formats[0] if len(formats) == 1 else "mixed-precision" if formats else "dense",
        quantization_status="compressed",
        ignore=list(ignore),
    )
    sparsity_config: dict[str, Any] = {}
    if sparsity is not None:
        structure, global_sparsity = sparsity
        sparsity_config = DenseSparsityConfig(
            global_sparsity=global_sparsity, sparsity_structure=sparsity_structure(structure)
        ).model_dump()
    return {
        **config.model_dump(exclude={"quant_method"}),
        "quant_method": "compressed-tensors",
        "sparsity_config": sparsity_config,
        "transform_config": {},
        "version": compressed_tensors.__version__,
    }


def ignored_modules(
    model: torch.nn.Module,
    schemes: Sequence[QuantizationScheme],
    quantized: Mapping[str, QuantizedWeight],
) -> list[str]:
    """Modules a config group targets that were not quantized, in model order.

    compressed-tensors and vLLM quantize every module a group's `targets` match unless it is in
    `ignore`, so every such module left in full precision must be named there.
    """
    return [
        name
        for name, module in model.named_modules()
        if name not in quantized
        and not (isinstance(module, ExpertProjection) and not module.stored_per_expert)
        and any(matches(name, module, scheme.targets) for scheme in schemes)
    ]
