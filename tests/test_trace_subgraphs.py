"""``trace_subgraphs`` as llm-compressor's drop-in: fixes on model instances, ``["Linear"]``
targets under sdpa, located failures, llm-compressor's ignore list on every built-in."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from llmc_trace import trace_subgraphs
from llmc_trace.compat import trace_subgraphs as compat_trace_subgraphs
from llmc_trace.diagnose.swept import swept_fix
from llmc_trace.compat.arguments import DEFAULT_TRACING_IGNORE
from llmc_trace.errors import NotTraceableError
from llmc_trace.graph.verify import replay, verify_subgraphs
from llmc_trace.models.build import build_twin
from llmc_trace.models.samples import SampleOptions, make_sample
from llmc_trace.models.source import resolve_model
from llmc_trace.traced.probe import sample_for
from llmc_trace.tracing.trace import concrete_arguments
from tests.conftest import tiny_llama, token_batch
from tests.test_builtins import EXPECTED_FAILURES, cases

SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


@pytest.mark.parametrize(
    "build",
    [
        lambda: tiny_llama(layers=2, attention="sdpa"),
        lambda: Qwen3ForCausalLM._from_config(
            Qwen3Config(head_dim=16, **SIZES), attn_implementation="sdpa"
        ),
    ],
    ids=["llama", "qwen3"],
)
def test_linear_targets_under_sdpa_with_padding(build) -> None:  # noqa: ANN001
    """sdpa's mask builder returns ``None`` for an unpadded batch; traced attention code must
    never decide on that, so a padded batch (left padding in row 1) replays exactly too."""
    torch.manual_seed(0)
    model = build().eval()
    unpadded = token_batch(batch=1)
    subgraphs = trace_subgraphs(model, unpadded, ["Linear"])
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(t for s in subgraphs for t in s.targets) == sorted(linears)
    assert all(len(s.targets) <= 1 for s in subgraphs)
    padded = token_batch(batch=2)
    with torch.no_grad():
        for sample in (unpadded, padded):
            expected = model(**sample, use_cache=False).logits
            actual = replay(model, subgraphs, sample).logits
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def qwen2_vl_with_image() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = build_twin(resolve_model("Qwen/Qwen2-VL-2B-Instruct"), seed=1)
    return model, make_sample(model.config, "image", SampleOptions(seq_len=32))


def test_trace_subgraphs_fixes_a_model_instance_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Qwen2-VL's ``get_rope_index`` iterates over token-type groups: traced as written it
    fails; the fix is proved on a twin of the instance's own class and logged."""
    model, sample = qwen2_vl_with_image()
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        subgraphs = trace_subgraphs(model, sample)
    assert "get_rope_index" in caplog.text
    with torch.no_grad():
        expected = model(**sample, use_cache=False).logits
        torch.testing.assert_close(replay(model, subgraphs, sample).logits, expected)


def test_without_fixes_the_failure_is_located() -> None:
    model, sample = qwen2_vl_with_image()
    with pytest.raises(NotTraceableError) as raised:
        trace_subgraphs(model, sample, fix=False)
    failure = raised.value.failure
    assert failure is not None and failure.location is not None
    assert failure.location.file.endswith("modeling_qwen2_vl.py")
    assert raised.value.fixes == []
    assert "modeling_qwen2_vl.py" in str(raised.value)


def route(h: torch.Tensor) -> torch.Tensor:
    if bool(h.mean() > 0):  # data-dependent: fx cannot follow it
        return h * 2
    return -h


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Routed(torch.nn.Module):
    """No transformers config, so no twin: the fix is proved on the sample itself."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](route(self.blocks[0](x)))


def test_a_module_without_config_is_fixed_on_its_sample() -> None:
    torch.manual_seed(0)
    model = Routed().eval()
    sample = {"x": torch.randn(2, 4)}
    subgraphs = trace_subgraphs(model, sample, ["Block"])
    with torch.no_grad():
        for x in (sample["x"], -sample["x"]):  # both branches, decided per batch at run time
            torch.testing.assert_close(replay(model, subgraphs, {"x": x}), model(x))


def test_a_model_on_meta_without_twin_is_not_accepted() -> None:
    """Nothing can prove a fix there: the located failure, not an unproven graph."""
    with torch.device("meta"):
        model = Routed()
    with pytest.raises(NotTraceableError, match="control flow") as raised:
        trace_subgraphs(model, {"x": torch.randn(2, 4, device="meta")}, ["Block"])
    assert raised.value.failure.location.function == "route"


def test_a_string_target_is_one_and_unknown_ignore_names_are_dropped_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """llm-compressor's contract: one ``tracing_ignore`` for every model, its names this model
    lacks dropped: its own defaults silently (every run passes them), a name the caller added
    with one warning, a likely typo named with its closest name."""
    model = tiny_llama(layers=2)
    ignore = [*DEFAULT_TRACING_IGNORE, "LlamaDecoderLayr"]
    with caplog.at_level(logging.WARNING, logger="llmc_trace"):
        subgraphs = trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", ignore)
    assert [s.targets for s in subgraphs] == [[], ["model.layers.0"], ["model.layers.1"]]
    [warning] = [r.getMessage() for r in caplog.records if "dropped from ignore" in r.getMessage()]
    assert "'LlamaDecoderLayr' (a likely typo of 'LlamaDecoderLayer')" in warning
    assert "_update_mamba_mask" not in warning and warning.count("a likely typo") == 1
    assert "create_causal_mask" not in warning  # Llama's mask builder: kept, not dropped
    compat = compat_trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", ignore)
    assert [s.targets for s in compat] == [s.targets for s in subgraphs]


def test_the_old_ignore_keyword_warns_and_traces_as_tracing_ignore(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``ignore=`` is ``tracing_ignore=`` for one release, with a ``DeprecationWarning``; the
    llm-compressor drop-in keeps its ``ignore`` and warns about nothing."""
    model = tiny_llama(layers=2)
    typo = ["LlamaDecoderLayr"]  # reaches the list's check: logged once per call, as a typo
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="llmc_trace"):
        warnings.simplefilter("error")
        new = trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", tracing_ignore=typo)
        compat = compat_trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", ignore=typo)
    with pytest.deprecated_call(match=r"trace_subgraphs\(ignore=\).*tracing_ignore="):
        old = trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", ignore=typo)
    logged = [r.getMessage() for r in caplog.records if "dropped from ignore" in r.getMessage()]
    assert len(logged) == 3 and all("LlamaDecoderLayr" in message for message in logged)
    assert [str(s.graph) for s in old] == [str(s.graph) for s in new]
    assert [s.targets for s in compat] == [s.targets for s in new]
    with pytest.raises(TypeError, match="tracing_ignore= and ignore="):
        trace_subgraphs(model, token_batch(), "LlamaDecoderLayer", typo, ignore=typo)


def _not_proved_by_attempt_alone(case: tuple[str, str]) -> bool:
    """A media case, or a type whose trace needs a fix. test_builtins proves every built-in
    through ``attempt_trace``, which traces with this same default list first: a text model that
    needs no fix traces there exactly as ``trace_subgraphs`` traces it here."""
    name, modality = case
    return modality != "text" or bool(swept_fix(resolve_model(name).config().model_type, "text"))


#: the built-ins and modalities that ``attempt`` verifies (test_builtins says where the others
#: stop) and that exercise more than its first trace, in shards ``pytest -n 2`` spreads
BUILTIN_CASES = [
    case for case in cases() if case not in EXPECTED_FAILURES and _not_proved_by_attempt_alone(case)
]
SHARDS = 4


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda s: f"shard{s + 1}of{SHARDS}")
def test_llm_compressors_default_ignore_verifies_on_media_and_fixed_builtin_twins(
    shard: int,
) -> None:
    """trace_subgraphs with llm-compressor's default ``tracing_ignore`` and the model's own
    sequential targets: replaying the subgraphs gives the twin's eager outputs, on every
    built-in's media modalities and every built-in whose type needs a fix (found and proved as
    trace_subgraphs does); the others trace as their attempt does (`_not_proved_by_attempt_alone`)."""
    failed = []
    for name, modality in BUILTIN_CASES[shard::SHARDS]:
        twin = build_twin(resolve_model(name))
        sample = sample_for(twin, modality, SampleOptions())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # configs' own deprecation notes
            subgraphs = trace_subgraphs(twin, sample, None, list(DEFAULT_TRACING_IGNORE))
        produced = {output for s in subgraphs for output in s.output_names}
        inputs = [
            k for k in sample if k not in produced and any(k in s.input_names for s in subgraphs)
        ]
        verification = verify_subgraphs(
            twin, subgraphs, sample, inputs, eager_kwargs=concrete_arguments(twin, {})
        )
        if not verification.ok:
            failed.append(f"{name} ({modality}): {verification.problems[:2]}")
    assert not failed, failed
