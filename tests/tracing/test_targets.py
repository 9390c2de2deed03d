"""Sequential targets as llm-compressor users pass them: lists with names the model never
builds, and class names that mean their subclasses too."""

from __future__ import annotations

import logging

import pytest
import torch

from llmc_trace.errors import BadInputError
from llmc_trace.tracing.targets import plan_leaves
from tests.conftest import tiny_llama


def test_a_list_that_partly_matches_plans_what_matches_and_reports_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = tiny_llama(layers=3)
    with caplog.at_level(logging.WARNING):
        plan = plan_leaves(model, ["CLIPTextEmbeddings", "LlamaDecoderLayer"], [])
    assert plan.targets == ("model.layers.0", "model.layers.1", "model.layers.2")
    assert plan.unmatched == ("CLIPTextEmbeddings",)
    assert "CLIPTextEmbeddings" in caplog.text
    with pytest.raises(BadInputError, match="'CLIPTextEmbeddings' does not exist") as info:
        plan_leaves(model, ["CLIPTextEmbeddings"], [])
    assert info.value.param == "sequential_targets"


class QuantLinear(torch.nn.Linear):
    """A library's subclass of ``nn.Linear``, as quantization and LoRA layers are."""


def test_a_class_name_matches_its_subclasses() -> None:
    model = tiny_llama(layers=2)
    model.model.layers[1].mlp.down_proj = QuantLinear(128, 64)
    linears = plan_leaves(model, ["Linear"], []).targets
    assert "model.layers.1.mlp.down_proj" in linears and "lm_head" in linears
    # ignoring by class: Linears inside a target are in a leaf already; the head is ignored
    assert plan_leaves(model, None, ["Linear"]).ignored == ("lm_head",)
    plan = plan_leaves(model, ["QuantLinear"], [])
    assert plan.targets == ("model.layers.1.mlp.down_proj",)


def test_a_model_without_layers_names_its_config_not_an_empty_target_list() -> None:
    """A config with no layers (num_hidden_layers -1 builds an empty ModuleList) was refused
    as "The sequential targets [] match no module", though nobody named targets."""
    model = tiny_llama(layers=0)
    with pytest.raises(BadInputError) as refused:
        plan_leaves(model, None, [])
    assert "has no repeated blocks (decoder layers)" in refused.value.message
    assert refused.value.param == "model" and "[]" not in refused.value.message
