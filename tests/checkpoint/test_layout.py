"""Per-module tensors and `quantization_config` equal what compressed-tensors itself writes."""

from __future__ import annotations

import compressed_tensors
import pytest
import torch
from compressed_tensors.compressors import (
    IntQuantizationCompressor,
    PackedQuantizationCompressor,
)
from compressed_tensors.quantization import preset_name_to_scheme

from llmc_trace.checkpoint.layout import module_tensor_specs, module_tensors, quantization_config
from llmc_trace.core.sizes import TensorSpec
from llmc_trace.algorithms import W4A16, W4A16_ASYM, W8A8, W8A16, QuantizationScheme, rtn


# compressed-tensors' compressor re-quantizes the dequantized weight, which gives back the
# stored integers only while that round trip is exact in the weight's dtype: always in float32,
# and in bfloat16 for 4 bits but not 8 (for |q| >= 64, bfloat16's spacing is 0.5 and the division
# back can land half-way and round to a neighbour; our stored integers are the exact ones).
@pytest.mark.parametrize(
    ("scheme", "dtype"),
    [
        (W4A16, torch.float32),
        (W4A16_ASYM, torch.float32),
        (W8A16, torch.float32),
        (W8A8, torch.float32),
        (W4A16, torch.bfloat16),
        (W4A16_ASYM, torch.bfloat16),
    ],
    ids=["w4a16", "w4a16-asym", "w8a16", "w8a8", "w4a16-bf16", "w4a16-asym-bf16"],
)
def test_module_tensors_equal_compressed_tensors_compressor(
    scheme: QuantizationScheme, dtype: torch.dtype
) -> None:
    W = (torch.randn(72, 256, generator=torch.Generator().manual_seed(0)) * 0.02).to(dtype)
    quantized = rtn(W, scheme.weights)
    ours = module_tensors("layer", quantized, scheme)

    theirs_scheme = preset_name_to_scheme(scheme.name, ["Linear"])
    compressor = (
        IntQuantizationCompressor if scheme.input_activations else PackedQuantizationCompressor
    )
    state = {"weight": quantized.weight, "weight_scale": quantized.scale}
    state["weight_zero_point"] = quantized.zero_point
    theirs = compressor.compress(state, theirs_scheme)

    assert sorted(ours) == sorted(f"layer.{name}" for name in theirs)
    for name, tensor in theirs.items():
        assert ours[f"layer.{name}"].dtype == tensor.dtype, name
        assert torch.equal(ours[f"layer.{name}"], tensor), name
    # what the writer plans before quantizing is what quantizing gives (72 rows: the packed
    # zero point's rows do not divide evenly)
    planned = module_tensor_specs("layer", (72, 256), scheme, dtype)
    assert planned == {name: TensorSpec(t.dtype, tuple(t.shape)) for name, t in ours.items()}


def test_w4a16_quantization_config_is_the_documented_layout() -> None:
    config = quantization_config([W4A16], ["lm_head"], None)
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and group["format"] == "pack-quantized"
    assert group["input_activations"] is None and group["output_activations"] is None
    weights = group["weights"]
    expected = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
    assert {key: weights[key] for key in expected} == expected
    assert weights["group_size"] == 128 and weights["dynamic"] is False
    assert weights["actorder"] == "static" and weights["observer"] == "memoryless_minmax"
    assert config["format"] == "pack-quantized" and config["ignore"] == ["lm_head"]
    assert config["quant_method"] == "compressed-tensors"
    assert config["quantization_status"] == "compressed"
    assert config["version"] == compressed_tensors.__version__
    assert config["sparsity_config"] == {} and config["transform_config"] == {}
    assert config["kv_cache_scheme"] is None and config["global_compression_ratio"] is None


def test_w8a8_config_records_dynamic_token_activations() -> None:
    config = quantization_config([W8A8], [], None)
    group = config["config_groups"]["group_0"]
    assert config["format"] == group["format"] == "int-quantized"
    assert group["weights"]["strategy"] == "channel" and group["weights"]["group_size"] is None
    activations = group["input_activations"]
    assert activations["strategy"] == "token" and activations["dynamic"] is True
    assert activations["num_bits"] == 8 and activations["symmetric"] is True


def test_asymmetric_config_names_the_zero_point_dtype() -> None:
    weights = quantization_config([W4A16_ASYM], [], None)["config_groups"]["group_0"]["weights"]
    assert weights["symmetric"] is False and weights["zp_dtype"] == "torch.int8"


def test_mixed_formats_and_sparsity_statement() -> None:
    linear = W4A16.with_weights(actorder=None)
    config = quantization_config([linear, W8A8], [], ((2, 4), 0.5))
    assert config["format"] == "mixed-precision"
    stated = {"format": "dense", "global_sparsity": 0.5, "sparsity_structure": "2:4"}
    assert {key: config["sparsity_config"][key] for key in stated} == stated
    # Null targets: vLLM 0.22-0.26 refuse a sparsity config that names any (issue #51188).
    assert config["sparsity_config"]["targets"] is None
