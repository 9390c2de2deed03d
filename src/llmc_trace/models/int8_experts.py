"""Read a mixture of experts stored `int-quantized` (W8A8, W4A8) into transformers' fused experts.

Such a checkpoint stores each expert's projection as compressed-tensors' int-quantized tensors
(`experts.3.gate_proj.weight` int8, `.weight_scale`, asymmetric schemes `.weight_zero_point`),
the layout compressed-tensors and vLLM read and llm-compressor writes. transformers (5.24)
joins per-expert tensors into the fused parameters (`experts.gate_up_proj`) through its
compressed-tensors op `CompressedTensorsDequantize`, which decompresses experts only from FP8
`weight`s and packed `weight_packed` tensors: from int8 ones it returns nothing, and the merge
fails ("Concatenate on tensors destined for ...gate_up_proj. Ckpt contains: 0"), for
llm-compressor's checkpoints as for ours.

:func:`reading_int8_experts` lets that op decompress int8 experts too, with compressed-tensors'
own int-quantized decompressor and the experts' config group, for the one load it wraps. The
experts come back dense, as transformers brings back FP8 experts.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import torch

from llmc_trace.models.weight_store import WeightStore

_PER_EXPERT_WEIGHT = re.compile(r"\.experts\.\d+\.[^.]+\.weight$")
_COMPANIONS = ("weight", "weight_scale", "weight_zero_point")


def int8_expert_weights(store: WeightStore) -> list[str]:
    """The experts' weights ``store`` holds as int8, one per expert and projection."""
    return [
        name
        for name, tensor in store.tensors.items()
        if tensor.dtype == torch.int8 and _PER_EXPERT_WEIGHT.search(name)
    ]


@contextlib.contextmanager
def reading_int8_experts() -> Iterator[None]:
    """Within the block, transformers' compressed-tensors loader decompresses int8 experts
    (see the module's docstring); every other tensor takes its own path."""
    from transformers.integrations.compressed_tensors import CompressedTensorsDequantize

    original = CompressedTensorsDequantize.convert

    def convert(self: Any, input_dict: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if not _holds_int8_experts(input_dict):
            return original(self, input_dict, *args, **kwargs)
        dtype = kwargs["model"].get_parameter(kwargs["full_layer_name"]).dtype
        return _decompressed(self, input_dict, dtype)

    CompressedTensorsDequantize.convert = convert  # type: ignore[method-assign]
    try:
        yield
    finally:
        CompressedTensorsDequantize.convert = original  # type: ignore[method-assign]


def _holds_int8_experts(input_dict: dict[str, Any]) -> bool:
    """Whether the op was handed experts' int8 weights (named `...experts.*.gate_proj.weight`;
    a dense module's own tensors come as bare `weight`, `weight_scale`)."""
    return any(
        key.endswith(".weight") and _listed(value)[0].dtype == torch.int8
        for key, value in input_dict.items()
    )


def _decompressed(op: Any, input_dict: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Each projection's experts, decompressed and stacked (experts, out, in), under its
    weight's pattern, as the op returns FP8 experts for the merge that follows."""
    from compressed_tensors.compressors import BaseCompressor
    from transformers.integrations.compressed_tensors import get_experts_scheme

    scheme = op.scheme or get_experts_scheme(op.hf_quantizer.compressor.quantization_config)
    compressor = BaseCompressor.get_value_from_registry("int-quantized")
    out = {}
    for key in input_dict:
        if not key.endswith(".weight"):
            continue
        stem = key.removesuffix("weight")
        parts = {n: _listed(input_dict[stem + n]) for n in _COMPANIONS if stem + n in input_dict}
        out[key] = torch.stack(
            [
                compressor.decompress({n: t[i] for n, t in parts.items()}, scheme)["weight"].to(
                    dtype
                )
                for i in range(len(parts["weight"]))
            ]
        )
    return out


def _listed(value: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    return value if isinstance(value, list) else [value]
