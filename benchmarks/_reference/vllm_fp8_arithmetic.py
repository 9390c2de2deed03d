"""vLLM's CPU arithmetic for FP8 weights per channel with FP8 activations per token, in torch.

vLLM 0.32's CPU build serves such a checkpoint (compressed-tensors' ``FP8_DYNAMIC``) through
``ChannelWiseTorchFP8ScaledMMLinearKernel`` (``vllm/model_executor/kernels/linear/scaled_mm/
pytorch.py``) after ``QuantFP8.forward_native`` (``.../quantization/input_quant_fp8.py``):

* each token's scale is its largest magnitude over 448 in float32, at least 1 / (448 x 512);
* the activation is multiplied (in float32) by the reciprocal of its scale, clamped to +-448
  and rounded to FP8 E4M3;
* the FP8 activation times the FP8 weight is accumulated in float32, then multiplied by the
  token's and the channel's scales in float32 and rounded once to the activation dtype.

transformers' compressed forward pass (compressed-tensors' fake quantization) runs the same
scheme with its steps in the model's dtype: the token scale, the quotient before rounding to
FP8 and the dequantized activation are each rounded to bfloat16, and the weight is decompressed
to bfloat16 before the product. Both are the declared scheme; their roundings differ, and
dynamic FP8 activations pass such differences on (a last-bit change flips a value to the next
FP8 step, 1/16 of its magnitude). :func:`use_vllm_fp8_arithmetic` puts vLLM's steps into a model
loaded by llmc-trace's evaluator, so the two can be told apart by measurement.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch

FP8_MAX = 448.0
#: vLLM's floor on a dynamic token scale (``_FP8_MIN_SCALING_FACTOR``).
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def fp8_per_token(quantization_config: dict[str, Any]) -> bool:
    """Whether every config group is the scheme this arithmetic covers: FP8 weights per
    channel or tensor, FP8 input activations per token, dynamic."""
    for group in quantization_config["config_groups"].values():
        weights, inputs = group.get("weights") or {}, group.get("input_activations") or {}
        if not (
            weights.get("type") == "float" and weights.get("num_bits") == 8
            and weights.get("strategy") in ("channel", "tensor")
            and inputs.get("type") == "float" and inputs.get("num_bits") == 8
            and inputs.get("strategy") == "token" and inputs.get("dynamic") is True
        ):  # fmt: skip
            return False
    return True


def _forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    scale = (rows.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    quantized = (rows.float() * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX)
    product = quantized.to(torch.float8_e4m3fn).float() @ self.vllm_fp8_weight.float().t()
    out = product * scale * self.vllm_fp8_scale.float().reshape(1, -1)
    if self.bias is not None:
        out = out + self.bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def use_vllm_fp8_arithmetic(model: torch.nn.Module, folder: Path) -> int:
    """Make each quantized linear layer of ``model`` (loaded from ``folder``) compute as vLLM's
    CPU FP8 kernel does, on the FP8 weight and scale stored in ``folder``'s safetensors (what
    vLLM loads). Returns the number of layers changed."""
    from safetensors.torch import load_file

    stored: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        stored.update(load_file(shard))
    changed = 0
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        weight = stored[f"{name}.weight"]
        if weight.dtype != torch.float8_e4m3fn:
            raise ValueError(f"{folder}: {name}.weight is {weight.dtype}, not FP8 E4M3")
        module.vllm_fp8_weight = weight
        module.vllm_fp8_scale = stored[f"{name}.weight_scale"]
        module.forward = types.MethodType(_forward, module)
        changed += 1
    return changed


def weights_only(model: torch.nn.Module) -> int:
    """Switch off compressed-tensors' activation quantization in ``model`` (the weights stay
    the checkpoint's): the score of a server that would ignore the activation scheme."""
    changed = 0
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            module.quantization_enabled = False
            changed += 1
    return changed
