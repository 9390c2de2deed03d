"""Smooth -> balance pairs read from the traced graph: the same as llm-compressor 0.14's published
tables, each proved by folding a scale on the twin, and the wrong ones refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import transformers as T

from llmc_trace.algorithms.scheme import DEFAULT_SCHEME
from llmc_trace.algorithms.smoothing import fold_scales
from llmc_trace.graph.mappings import Mapping
from llmc_trace.models.build import twin_of_class
from llmc_trace.models.samples import SampleOptions
from llmc_trace.moe import observe_experts
from llmc_trace.traced.mappings import (
    PROOF_TOLERANCE,
    MappingSet,
    find_mappings,
    fold_changes,
    numberless,
)
from llmc_trace.traced.probe import sample_for
from llmc_trace.tracing.options import TracingOptions

COMMON = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4,
)  # fmt: skip

# llm-compressor 0.14's AWQ tables (modifiers/transform/awq/mappings.py), written out here as
# layer 0's pairs: default_mappings (Llama, Mistral, Qwen2, Qwen3), _gemma2_mappings,
# _gemma3_mappings, _phi_mappings (fused projections: its rule scales the last rows of the
# smooth layer, which is the v part of qkv_proj and the up half of gate_up_proj) and
# _moe_default_mappings' attention pairs.
L = "model.layers.#."
ATTENTION = {
    (L + "input_layernorm", (L + "self_attn.q_proj", L + "self_attn.k_proj", L + "self_attn.v_proj")),
    (L + "self_attn.v_proj", (L + "self_attn.o_proj",)),
}  # fmt: skip
DEFAULT = ATTENTION | {
    (L + "post_attention_layernorm", (L + "mlp.gate_proj", L + "mlp.up_proj")),
    (L + "mlp.up_proj", (L + "mlp.down_proj",)),
}
GEMMA2 = ATTENTION | {
    (L + "pre_feedforward_layernorm", (L + "mlp.gate_proj", L + "mlp.up_proj")),
    (L + "mlp.up_proj", (L + "mlp.down_proj",)),
}
PHI3 = {
    (L + "input_layernorm", (L + "self_attn.qkv_proj",)),
    (L + "self_attn.qkv_proj", (L + "self_attn.o_proj",)),
    (L + "post_attention_layernorm", (L + "mlp.gate_up_proj",)),
    (L + "mlp.gate_up_proj", (L + "mlp.down_proj",)),
}

CASES = {
    "llama": (T.LlamaForCausalLM, T.LlamaConfig(**COMMON, num_key_value_heads=4), DEFAULT),
    "mistral": (T.MistralForCausalLM, T.MistralConfig(**COMMON, num_key_value_heads=4), DEFAULT),
    "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**COMMON, num_key_value_heads=4), DEFAULT),
    "qwen3": (
        T.Qwen3ForCausalLM, T.Qwen3Config(**COMMON, num_key_value_heads=4, head_dim=16), DEFAULT
    ),
    "gemma2": (
        T.Gemma2ForCausalLM, T.Gemma2Config(**COMMON, num_key_value_heads=4, head_dim=16), GEMMA2
    ),
    # llm-compressor leaves Gemma 3's input_layernorm -> q/k/v out by choice (its issue 2522:
    # smoothing ahead of q_norm/k_norm measured worse); the graph shows, and the twin proves,
    # that the pair keeps the function, so it is found here
    "gemma3": (
        T.Gemma3ForCausalLM,
        T.Gemma3TextConfig(**COMMON, num_key_value_heads=4, head_dim=16),
        GEMMA2,
    ),
    "phi3": (T.Phi3ForCausalLM, T.Phi3Config(**COMMON, num_key_value_heads=4, pad_token_id=0), PHI3),
}  # fmt: skip

EXPERTS = 4
QWEN3_MOE = T.Qwen3MoeConfig(
    **COMMON, num_key_value_heads=4, head_dim=16, num_experts=EXPERTS, num_experts_per_tok=2,
    moe_intermediate_size=32,
)  # fmt: skip
# llm-compressor 0.14's AWQ table for Qwen3-MoE (_moe_default_mappings), layer 0, its patterns
# expanded over the twin's experts: the router (mlp.gate) is balanced with the experts' gate and
# up projections, and every up_proj (each expert's) smooths its down_proj
E = [f"{L}mlp.experts.{e}." for e in range(EXPERTS)]
MOE_AWQ = {
    (L + "input_layernorm", frozenset({L + "self_attn.q_proj", L + "self_attn.k_proj", L + "self_attn.v_proj"})),
    (L + "self_attn.v_proj", frozenset({L + "self_attn.o_proj"})),
    (L + "post_attention_layernorm", frozenset({L + "mlp.gate", *(e + p for e in E for p in ("gate_proj", "up_proj"))})),
    *((e + "up_proj", frozenset({e + "down_proj"})) for e in E),
}  # fmt: skip
# its SmoothQuant table for Qwen3-MoE (QWEN_MOE_SMOOTHQUANT_MAPPINGS) keeps only
# input_layernorm -> q/k/v, as for every model it smooths norms only; it leaves the MLP norm out
# by choice (one scale for all experts measured worse there). Here both methods scale the same
# pairs, each proved to keep the function, as for the dense models above.


def _pairs(
    cls: type, config: object, is_target: Callable[[str, torch.nn.Module], bool] | None = None
) -> tuple[MappingSet, torch.nn.Module]:
    twin = twin_of_class(cls, config)  # type: ignore[arg-type]
    sample = sample_for(twin, "text", SampleOptions())
    options = TracingOptions.parse(twin, [], None, 1)
    found = find_mappings(
        twin, sample, twin, sample, options,
        is_target or (lambda name, _: not name.endswith("lm_head")),
    )  # fmt: skip
    return found, twin


@pytest.mark.parametrize("arch", sorted(CASES))
def test_derived_pairs_equal_llm_compressors_tables(arch: str, one_thread: None) -> None:
    cls, config, expected = CASES[arch]
    found, twin = _pairs(cls, config)
    layer0 = {
        (numberless(m.smooth), tuple(numberless(b) for b in m.balance))
        for m in found.mappings
        if ".0." in m.smooth
    }
    assert layer0 == expected
    layers = twin.config.num_hidden_layers
    assert len(found.mappings) == layers * len(expected)
    assert [s.smooth for s in found.skipped] == ["model.norm"]  # lm_head stays unquantized
    if arch.startswith("gemma"):
        assert set(found.offsets.values()) == {1.0}  # Gemma's norms multiply by 1 + weight


def test_fused_projections_scale_only_the_rows_that_reach_the_balance_layer(
    one_thread: None,
) -> None:
    cls, config, _ = CASES["phi3"]
    found, _ = _pairs(cls, config)
    rows = {numberless(m.smooth): m.rows for m in found.mappings}
    q, kv = 4 * 16, 4 * 16  # 4 heads of 16 for q, k and v each
    assert rows[L + "self_attn.qkv_proj"] == (q + kv, q + 2 * kv)  # the v part
    assert rows[L + "mlp.gate_up_proj"] == (96, 192)  # the up half
    assert rows[L + "input_layernorm"] is None


def test_grouped_query_attention_skips_v_to_o_and_says_why(one_thread: None) -> None:
    config = T.MistralConfig(**COMMON, num_key_value_heads=2)
    found, _ = _pairs(T.MistralForCausalLM, config)
    smooths = {numberless(m.smooth) for m in found.mappings}
    assert L + "self_attn.v_proj" not in smooths
    reasons = {s.smooth: s.reason for s in found.skipped}
    assert "grouped-query attention" in reasons["model.layers.0.self_attn.v_proj"]


def test_the_proof_refuses_a_pair_that_does_not_keep_the_function(one_thread: None) -> None:
    twin = twin_of_class(T.LlamaForCausalLM, CASES["llama"][1])
    sample = sample_for(twin, "text", SampleOptions())
    before = {k: v.clone() for k, v in twin.state_dict().items()}
    true = Mapping("model.layers.0.mlp.up_proj", ("model.layers.0.mlp.down_proj",))
    # gate's output goes through SiLU before it meets down_proj: no scale passes that
    wrong = Mapping("model.layers.0.mlp.gate_proj", ("model.layers.0.mlp.down_proj",))
    assert fold_changes(twin, sample, true) < PROOF_TOLERANCE / 100
    assert fold_changes(twin, sample, wrong) > 5 * PROOF_TOLERANCE
    for key, value in twin.state_dict().items():
        assert torch.equal(value, before[key]), key  # every fold undone


def test_moe_pairs_equal_llm_compressors_moe_table_router_kept(one_thread: None) -> None:
    # what compress quantizes by default: every linear layer and expert projection but
    # lm_head (a router is no linear layer: it stays in full precision)
    found, _ = _pairs(T.Qwen3MoeForCausalLM, QWEN3_MOE, DEFAULT_SCHEME.is_target)
    layer0 = {
        (m.smooth.replace(".0.", ".#.", 1), frozenset(r.replace(".0.", ".#.", 1) for r in m.readers))
        for m in found.mappings
        if m.smooth.startswith("model.layers.0.")
    }  # fmt: skip
    assert layer0 == MOE_AWQ
    assert len(found.mappings) == 2 * len(MOE_AWQ)
    norm = next(m for m in found.mappings if m.smooth.endswith("0.post_attention_layernorm"))
    # llm-compressor lists the router among the balance layers and ignores it when quantizing;
    # here it is kept apart: scaled with the experts, left out of the scales' choice
    assert norm.kept == ("model.layers.0.mlp.gate",)
    assert len(norm.balance) == 2 * EXPERTS
    assert [s.smooth for s in found.skipped] == ["model.norm"]


@torch.no_grad()
def test_moe_pairs_keep_the_function_at_scale_2_only_with_the_router_balanced(
    one_thread: None,
) -> None:
    twin = twin_of_class(T.Qwen3MoeForCausalLM, QWEN3_MOE)
    sample = sample_for(twin, "text", SampleOptions())
    found, _ = _pairs(T.Qwen3MoeForCausalLM, QWEN3_MOE, DEFAULT_SCHEME.is_target)
    expected = twin(**sample).logits
    largest = float(expected.abs().max())
    with observe_experts(twin):
        for mapping in found.mappings:  # every pair at once, a scale of 2 on every channel
            smooth = twin.get_submodule(mapping.smooth)
            readers = [twin.get_submodule(n) for n in mapping.readers]
            width = readers[0].weight.shape[1]
            fold_scales(smooth, readers, torch.full((width,), 2.0))
        folded = twin(**sample).logits
    assert float((folded - expected).abs().max()) < 1e-5 * largest
    assert not torch.equal(twin.model.layers[0].mlp.gate.weight, twin_of_class(
        T.Qwen3MoeForCausalLM, QWEN3_MOE).model.layers[0].mlp.gate.weight)  # fmt: skip

    # the norm scaled with the experts but not the router: the routing changes
    fresh = twin_of_class(T.Qwen3MoeForCausalLM, QWEN3_MOE)
    norm = next(m for m in found.mappings if m.smooth.endswith("0.post_attention_layernorm"))
    with observe_experts(fresh):
        experts_only = Mapping(norm.smooth, norm.balance)
        with_router = Mapping(norm.smooth, norm.balance, kept=norm.kept)
        assert fold_changes(fresh, sample, with_router) < PROOF_TOLERANCE / 100
        assert fold_changes(fresh, sample, experts_only) > 5 * PROOF_TOLERANCE
        # an expert's gate output goes through its activation before down_proj: refused (one
        # expert of one layer reaches few tokens, so its change is smaller than the norm's: the
        # busiest is taken, whose change the twin's draws do not bring near the tolerance)
        expert = f"model.layers.0.mlp.experts.{_busiest_expert(fresh, sample)}."
        true = Mapping(expert + "up_proj", (expert + "down_proj",))
        wrong = Mapping(expert + "gate_proj", (expert + "down_proj",))
        assert fold_changes(fresh, sample, true) < PROOF_TOLERANCE / 100
        assert fold_changes(fresh, sample, wrong) > PROOF_TOLERANCE


def _busiest_expert(model: torch.nn.Module, sample: dict[str, torch.Tensor]) -> int:
    """The expert of the first layer that the most tokens of ``sample`` are routed to."""
    routed: list[torch.Tensor] = []
    router = model.get_submodule("model.layers.0.mlp.gate")
    hook = router.register_forward_hook(lambda _m, _i, output: routed.append(output[2]))
    try:
        with torch.no_grad():
            model(**sample)
    finally:
        hook.remove()
    return int(torch.bincount(routed[0].flatten()).argmax())


def test_coverage_counts_the_pairs_of_a_built_in(one_thread: None) -> None:
    import json

    from click.testing import CliRunner

    from llmc_trace.cli.main import cli
    from llmc_trace.models.source import resolve_model

    name = "Qwen/Qwen3-0.6B"
    result = CliRunner().invoke(
        cli,
        ["--quiet", "coverage", "-m", name, "--modality", "text", "--no-fix", "--pairs", "--json"],
    )
    (row,) = json.loads(result.output)["rows"]
    layers = resolve_model(name).config().num_hidden_layers
    # llm-compressor's default table per layer, v_proj -> o_proj left out: 8 key/value heads
    # for 16 query heads (grouped-query attention), as is model.norm -> lm_head (not quantized)
    assert row["pairs"] == 3 * layers
    assert row["pairs_skipped"] == layers + 1
    assert f"grouped-query attention); {layers - 1} more like it" in row["pairs_note"]
    assert "lm_head is not quantized" in row["pairs_note"]
    assert 0 < row["pairs_s"]


def test_a_trace_stopped_inside_a_layer_is_fixed_and_the_layers_pairs_found(
    one_thread: None,
) -> None:
    """Traced into, Florence-2's BART encoder layer asks whether its hidden states are finite
    (a value no trace knows), which the layer trace, holding the layer as one call, never
    reads: the fix `attempt --fix` would find is searched for, and the layer's own pairs are
    then found in every layer and proved."""
    from llmc_trace.traced.mappings import source_mappings

    found = source_mappings("florence-community/Florence-2-base")
    (entry,) = found.fix
    assert entry.startswith("autowrap:BartEncoderLayer.forward@")
    encoder = "model.language_model.encoder.layers."
    pairs = {(m.smooth, m.balance) for m in found.mappings if m.smooth.startswith(encoder)}
    assert pairs == {
        (f"{encoder}{n}.self_attn.v_proj", (f"{encoder}{n}.self_attn.out_proj",)) for n in range(6)
    }


class _GatedMixer(torch.nn.Module):
    """A layer whose first projection runs behind a data-dependent ``if``: the trace into the
    layer stops there, and the fix records the whole statement, projection inside, as one
    call."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.inner = torch.nn.Linear(width, width)
        self.outer = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if h.abs().sum() >= 0:  # always true, but only the data says so
            h = self.inner(h)
        return x + self.outer(torch.relu(h))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_GatedMixer(), _GatedMixer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_layers_a_fix_runs_inside_a_recorded_call_are_named_never_smoothed(
    one_thread: None,
) -> None:
    torch.manual_seed(0)
    model = _Stack().eval()
    sample = {"x": torch.randn(1, 5, 16)}
    options = TracingOptions.parse(model, [], ["_GatedMixer"], 1)
    found = find_mappings(model, sample, model, sample, options, lambda name, _: True)
    (entry,) = found.fix
    assert entry.startswith("autowrap:_GatedMixer.forward@")
    assert found.unreached == ("layers.0.inner", "layers.1.inner")
    assert not any("inner" in m.smooth or "inner" in " ".join(m.balance) for m in found.mappings)
    (line,) = [line for line in found.skipped_lines() if line.startswith("not examined")]
    assert line.startswith("not examined: layers.0.inner and 1 more (run inside one recorded call")


def test_a_size_check_moved_into_a_call_blocks_no_pair_and_dropout_no_proof(
    one_thread: None,
) -> None:
    """SpeechT5's attention checks its outputs' sizes, which follow from shapes alone (its
    mask builder's too): the trace into the layers needs no fix. Moved into recorded calls,
    each check reads the value for its shape only, so v_proj -> out_proj still passes. Its
    speech prenet drops out in eval mode as well: the twin's forwards repeat their random
    draws, so that only a fold can change the output and each pair is proved."""
    import inspect

    from llmc_trace import TracingSettings
    from llmc_trace.traced.mappings import source_mappings

    forward = T.models.speecht5.modeling_speecht5.SpeechT5Attention.forward
    lines, first = inspect.getsourcelines(forward)
    checks = [
        f"autowrap:SpeechT5Attention.forward@{first + i}"
        for i, line in enumerate(lines)
        if ".size() != " in line
    ]
    assert len(checks) == 3
    found = source_mappings("microsoft/speecht5_tts")
    moved = source_mappings(
        "microsoft/speecht5_tts", tracing=TracingSettings(tracing_ignore=checks)
    )
    assert not found.fix and not moved.fix
    encoder = "speecht5.encoder.wrapped_encoder.layers."
    expected = {
        (f"{encoder}{n}.attention.v_proj", (f"{encoder}{n}.attention.out_proj",)) for n in range(12)
    }
    for mappings in (found, moved):
        pairs = {(m.smooth, m.balance) for m in mappings.mappings if m.smooth.startswith(encoder)}
        assert pairs == expected
    assert not [s for s in found.skipped if "changed the output" in s.reason]
