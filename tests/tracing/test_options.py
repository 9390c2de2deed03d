"""``TracingOptions.parse``: the ignore strings sorted into typed fields, or refused."""

from __future__ import annotations

import pytest

from llmc_trace.errors import BadInputError
from llmc_trace.tracing.options import TracingOptions
from tests.conftest import tiny_llama


def test_each_kind_of_entry_lands_in_its_field_and_round_trips() -> None:
    model = tiny_llama()
    ignore = [
        "LlamaRotaryEmbedding",
        "re:model\\.norm",
        "create_causal_mask",
        "LlamaModel.forward",
        "autowrap:LlamaModel.forward@3",
        "tracing_models:RwkvModel",
    ]
    options = TracingOptions.parse(model, ignore, ["LlamaDecoderLayer"], 2)
    assert options.ignored_modules == ("LlamaRotaryEmbedding", "re:model\\.norm")
    assert options.opaque_calls == ("create_causal_mask", "LlamaModel.forward")
    assert options.autowraps == ("autowrap:LlamaModel.forward@3",)
    assert options.definitions == ("tracing_models:RwkvModel",)
    assert options.sequential_targets == ("LlamaDecoderLayer",)
    assert options.tracing_ignore() == ignore
    assert (
        TracingOptions.parse(model, options.tracing_ignore(), ["LlamaDecoderLayer"], 2) == options
    )


def test_a_mistyped_class_name_is_refused_with_the_closest_names() -> None:
    """It used to become a function name that matched nothing, silently."""
    with pytest.raises(BadInputError, match="matches no module class") as info:
        TracingOptions.parse(tiny_llama(), ["LlamaRotaryEmbeding"])
    assert info.value.param == "tracing_ignore"
    assert "'LlamaRotaryEmbedding'" in info.value.hint


@pytest.mark.parametrize("pattern", ["re:[", "re:(model"])
def test_an_invalid_regular_expression_is_bad_input(pattern: str) -> None:
    with pytest.raises(BadInputError, match="not a valid regular expression"):
        TracingOptions.parse(tiny_llama(), [pattern])
    with pytest.raises(BadInputError, match="not a valid regular expression") as info:
        TracingOptions.parse(tiny_llama(), [], [pattern])
    assert info.value.param == "sequential_targets"


def test_targets_per_subgraph_below_one_is_bad_input() -> None:
    with pytest.raises(BadInputError) as info:
        TracingOptions(targets_per_subgraph=0)
    assert info.value.param == "targets_per_subgraph"
