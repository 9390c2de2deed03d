"""Float grids (FP8 E4M3, FP6 E2M3, FP4 E2M1) with compressed-tensors' own rules.

A float grid's values are those of a small float format times a scale, so quantizing needs
only the format's rounding rule (round to the nearest representable value, ties to even,
saturating at its largest value) and the scales. Both come from compressed-tensors itself,
the format's reference, so what we store is what its compressors would store:

* scales (`calculate_qparams`): absmax / the format's largest value, in the model's dtype
  (FP8 per tensor, channel, group or 128x128 block); a power of two per 32 values for the MX
  formats (`generate_mx_scales`: stored as a uint8 exponent); for NVFP4 an FP8 E4M3 scale per
  16 values under a float32 per-tensor global scale (`generate_gparam`: 448 * 6 / absmax),
  the stored scale being global * absmax / 6 rounded to FP8 and the effective one
  stored / global;
* rounding (`round_to_quantized_type_args`): clamp, then the format's cast.

The chosen values are held as `float8_e4m3fn` (every FP8, FP6 E2M3 and FP4 E2M1 value is one
exactly, so a code costs one byte, as an integer code does), and a weight is `code * scale`
computed in float32 and rounded once to the model's dtype: compressed-tensors' `dequantize`,
op for op, so a reloaded checkpoint decompresses to exactly our weights.

compressed-tensors is imported where a float grid is first used: it imports transformers,
seconds that an integer grid's GPTQ in a process of its own would pay for nothing.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from llmc_trace.algorithms.scheme import QuantizationArgs

if TYPE_CHECKING:
    from compressed_tensors.quantization import QuantizationArgs as CtQuantizationArgs

CODE_DTYPE = torch.float8_e4m3fn
"""How a float grid's chosen values are held (exactly, see the module docstring)."""

_CT_OBSERVER = {"minmax": "memoryless_minmax", "mse": "memoryless_mse"}
"""Our observers under llm-compressor's names: both compute the range from the weight alone."""


@functools.cache
def ct_weight_args(args: QuantizationArgs) -> CtQuantizationArgs:
    """Our weight arguments as compressed-tensors' `QuantizationArgs` (what a checkpoint's
    config says, and what its rounding and scale rules take)."""
    from compressed_tensors.quantization import QuantizationArgs as CtQuantizationArgs

    extra: dict[str, object] = {}
    if args.is_float:
        extra = {
            "block_structure": list(args.block_structure) if args.block_structure else None,
            "scale_dtype": getattr(torch, args.scale_dtype) if args.scale_dtype else None,
            "zp_dtype": getattr(torch, args.scale_dtype or "float8_e4m3fn"),
        }
    elif not args.symmetric:
        extra = {"zp_dtype": torch.int8}
    return CtQuantizationArgs(
        num_bits=args.num_bits,
        type=args.type,
        symmetric=args.symmetric,
        strategy=args.strategy,
        group_size=args.group_size,
        dynamic=False,
        actorder=args.actorder,
        observer=_CT_OBSERVER[args.observer],
        **extra,
    )


def tensor_global_scale(W: torch.Tensor, args: QuantizationArgs) -> torch.Tensor | None:
    """NVFP4's per-tensor float32 global scale of `W` (448 * 6 / absmax), as
    compressed-tensors generates it (from the weight in float32); None for other grids."""
    if args.strategy != "tensor_group":
        return None
    from compressed_tensors.quantization.utils import generate_gparam

    W = W.float()
    return generate_gparam(W.amin(), W.amax())


def float_qparams(
    xmin: torch.Tensor,
    xmax: torch.Tensor,
    args: QuantizationArgs,
    scale_dtype: torch.dtype,
    global_scale: torch.Tensor | None,
) -> torch.Tensor:
    """The stored scale for each range (`xmin`, `xmax` already contain 0), in `scale_dtype`
    (the model's): FP8 scales, MX powers of two and NVFP4's FP8 values all are one exactly."""
    from compressed_tensors.quantization.utils import calculate_qparams

    scale, _ = calculate_qparams(
        xmin.to(scale_dtype), xmax.to(scale_dtype), ct_weight_args(args), global_scale
    )
    return scale.to(scale_dtype)


def effective_scale(scale: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
    """The float32 scale a code is multiplied by: the stored one, divided by the global scale
    where there is one (compressed-tensors' `dequantize`)."""
    return scale.float() if global_scale is None else scale.float() / global_scale.float()


def round_to_float_grid(x: torch.Tensor, args: QuantizationArgs) -> torch.Tensor:
    """`x` (already divided by its scale) on the format's nearest value, as float32.

    A small negative value rounds to -0.0; adding 0.0 makes it +0.0, the zero compressed-tensors
    packs (its compressor sees the dequantized weight, where both zeros are 0)."""
    from compressed_tensors.quantization.quant_args import round_to_quantized_type_args

    bound = torch.tensor(args.qmax, device=x.device)
    return round_to_quantized_type_args(x.float(), ct_weight_args(args), -bound, bound).add_(0.0)
