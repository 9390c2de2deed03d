"""Schemes: presets as compressed-tensors defines them, validation, and target matching."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.utils import is_match

from llmc_trace.algorithms import (
    DEFAULT_IGNORE,
    PRESET_NAMES,
    W4A16,
    QuantizationArgs,
    SchemeError,
    matches,
    resolve_scheme,
)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_presets_agree_with_compressed_tensors(name: str) -> None:
    ours = resolve_scheme(name.lower())
    theirs = preset_name_to_scheme(name, ["Linear"])
    assert ours.name == name
    assert ours.weights.num_bits == theirs.weights.num_bits
    assert ours.weights.type == theirs.weights.type
    assert ours.weights.symmetric == theirs.weights.symmetric
    assert ours.weights.strategy == theirs.weights.strategy
    assert ours.weights.group_size == theirs.weights.group_size
    assert list(ours.weights.block_structure or []) == list(theirs.weights.block_structure or [])
    scale_dtype = theirs.weights.scale_dtype
    assert ours.weights.scale_dtype == (None if scale_dtype is None else str(scale_dtype)[6:])
    assert ours.weights.actorder == "static"  # the one default the project adds
    if theirs.input_activations is None:
        assert ours.input_activations is None
    else:
        activations = ours.input_activations
        assert activations is not None
        for field in ("num_bits", "type", "strategy", "group_size", "dynamic", "symmetric"):
            assert getattr(activations, field) == getattr(theirs.input_activations, field), field


def test_every_preset_that_quantizes_is_offered() -> None:
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    assert set(PRESET_NAMES) == set(PRESET_SCHEMES) - {"UNQUANTIZED"}
    assert {"FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "MXFP4A16", "W4A8", "INT8"} <= set(PRESET_NAMES)


def test_unknown_scheme_lists_the_presets_compress_runs() -> None:
    with pytest.raises(SchemeError, match="unknown quantization scheme 'W3A7'") as info:
        resolve_scheme("W3A7")
    assert isinstance(info.value, ValueError)
    offered = info.value.hint.split(": ", 1)[1].split(" (")[0].split(", ")
    assert "W4A16" in offered and "NVFP4A16" in offered and "FP8_DYNAMIC" in offered
    assert "NVFP4" not in offered and "FP8" not in offered  # static activation scales
    assert set(offered) < set(PRESET_NAMES)


@pytest.mark.parametrize(
    "changes",
    [
        {"num_bits": 1},
        {"num_bits": 9},
        {"strategy": "group", "group_size": None},
        {"strategy": "channel", "group_size": 128},
        {"strategy": "channel", "group_size": None, "actorder": "group"},
        {"strategy": "block", "group_size": None},
        {"observer": "percentile"},
        {"actorder": "weight"},
        {"type": "float", "num_bits": 5},
        {
            "type": "float",
            "num_bits": 8,
            "strategy": "channel",
            "group_size": None,
            "symmetric": False,
        },
        {"type": "float", "num_bits": 4, "strategy": "channel", "group_size": None},
        {"type": "float", "num_bits": 4, "group_size": 32},  # MX without its exponent scales
        {
            "type": "float",
            "num_bits": 8,
            "strategy": "block",
            "group_size": None,
            "block_structure": (128,),
        },
        {"num_bits": 4, "strategy": "tensor_group", "group_size": 16},  # integer NVFP4
    ],
)
def test_invalid_args_raise_with_a_hint(changes: dict[str, object]) -> None:
    with pytest.raises(SchemeError) as info:
        QuantizationArgs(**changes)  # type: ignore[arg-type]
    assert info.value.hint


def test_per_channel_variant_from_a_preset() -> None:
    scheme = W4A16.with_weights(strategy="channel", group_size=None)
    assert scheme.weights.strategy == "channel" and scheme.weights.num_bits == 4
    assert W4A16.weights.strategy == "group"  # the preset itself is unchanged


class _Tower(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)


class _TinyVLM(torch.nn.Module):
    """Module paths as in Llava-style models (vision tower, projector, language model)."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_tower = _Tower()
        self.multi_modal_projector = torch.nn.Linear(4, 4)
        self.language_model = torch.nn.ModuleDict({"q_proj": torch.nn.Linear(4, 4)})
        self.norm = torch.nn.LayerNorm(4)
        self.lm_head = torch.nn.Linear(4, 8)


@pytest.mark.parametrize(
    "patterns",
    [
        ("Linear",),
        ("LayerNorm",),
        ("Module",),
        ("lm_head",),
        ("re:.*proj",),
        ("re:proj",),
        DEFAULT_IGNORE,
        ("language_model.q_proj", "re:vision.*"),
    ],
)
def test_matches_agrees_with_compressed_tensors(patterns: tuple[str, ...]) -> None:
    model = _TinyVLM()
    for name, module in model.named_modules():
        assert matches(name, module, patterns) == is_match(name, module, list(patterns)), name


def test_default_scheme_keeps_only_the_head() -> None:
    """Towers are kept by the model's structure (models.parts), not by the scheme's names."""
    model = _TinyVLM()
    targeted = [name for name, module in model.named_modules() if W4A16.is_target(name, module)]
    assert targeted == ["vision_tower.proj", "multi_modal_projector", "language_model.q_proj"]
