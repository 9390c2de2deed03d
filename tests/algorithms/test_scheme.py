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


@pytest.mark.parametrize("name", ["W4A16", "W4A16_ASYM", "W8A16", "W8A8"])
def test_presets_agree_with_compressed_tensors(name: str) -> None:
    ours = resolve_scheme(name.lower())
    theirs = preset_name_to_scheme(name, ["Linear"])
    assert ours.name == name
    assert ours.weights.num_bits == theirs.weights.num_bits
    assert ours.weights.symmetric == theirs.weights.symmetric
    assert ours.weights.strategy == theirs.weights.strategy
    assert ours.weights.group_size == theirs.weights.group_size
    if theirs.input_activations is None:
        assert ours.input_activations is None
    else:
        assert ours.input_activations is not None
        assert ours.input_activations.num_bits == theirs.input_activations.num_bits
        assert theirs.input_activations.dynamic and theirs.input_activations.strategy == "token"


def test_unknown_scheme_lists_the_valid_names() -> None:
    with pytest.raises(SchemeError) as info:
        resolve_scheme("W3A7")
    assert isinstance(info.value, ValueError)
    for name in PRESET_NAMES:
        assert name in info.value.hint


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
