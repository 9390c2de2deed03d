"""Every built-in model and modality: replay equals eager, or the failure is where we say.

``attempt_trace(..., fix=True)`` traces the full-size config on ``meta`` and verifies on the
tiny twin. Architectures we cannot (yet) verify are listed in ``EXPECTED_FAILURES`` with the
file and function the report must name, so a regression in either direction shows up.
"""

from __future__ import annotations

import functools

import pytest
import transformers
from transformers import PretrainedConfig

from llmc_trace.attempt.prove import attempt_trace
from llmc_trace.core.versions import dotted, release
from llmc_trace.errors import BadInputError
from llmc_trace.models.samples import supported_modalities
from llmc_trace.models.source import builtin_names, resolve_model

#: (model, modality) -> what the report must say instead of "verified":
#: ("trace", model file, function) for a located trace failure, ("verify", problem fragment)
#: for a trace that verification rejects, ("input", message fragment) for bad input.
EXPECTED_FAILURES: dict[tuple[str, str], tuple[str, ...]] = {
    # the whole Omni model only generates (its forward is unimplemented, its architectures
    # entry no class); coverage --all sweeps the thinker from this config's thinker_config
    ("Qwen/Qwen2.5-Omni-3B", "text"): ("input", "transformers has no model class"),
    # its published config has no audio tower, though its forward takes audio features
    ("google/gemma-4-26B-A4B", "audio"): ("input", "has no audio encoder"),
}

#: (model, modality) -> the fix that must make it verify (the start of its ignore entry).
FIXED_BY: dict[tuple[str, str], str] = {
    # a data-dependent branch directly in the top-level forward: only autowrap reaches it
    ("google/gemma-4-26B-A4B", "text"): "autowrap:Gemma4ForConditionalGeneration.forward@",
    # its forward rescales its own weights in place: only a definition keeps that out of the graph
    ("RWKV/rwkv-4-169m-pile", "text"): "tracing_models:RwkvModel",
    # the branch on expanded audio tokens merges them in place; position_ids stays None
    ("Qwen/Qwen2-Audio-7B-Instruct", "audio"): "autowrap:Qwen2AudioModel.forward@",
    # the features are split by sizes read from the image's spatial shapes: one opaque call
    ("LiquidAI/LFM2-VL-450M", "image"): "Lfm2VlModel.get_image_features",
    # the rope index reads the length of a grid-dependent list: the fix the sweep verified,
    # on a twin whose tower keeps the full model's deepstack layers
    ("Qwen/Qwen3-VL-4B-Thinking", "image"): "Qwen3VLModel.get_rope_index",
    ("Qwen/Qwen3-VL-4B-Thinking", "video"): "Qwen3VLModel.get_rope_index",
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", "image"): "Qwen3VLMoeModel.get_rope_index",
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", "video"): "Qwen3VLMoeModel.get_rope_index",
}
#: (model, modality) of FIXED_BY -> the transformers release from which it needs its fix: the
#: releases before it trace the model as written.
NEEDED_FROM: dict[tuple[str, str], tuple[int, int]] = {
    ("google/gemma-4-26B-A4B", "text"): (5, 23),  # the branch came into the forward in 5.23
}

#: Acceptance list: these must trace and verify (with fixes where needed).
REQUIRED = [
    ("Qwen/Qwen2-VL-2B-Instruct", "image"),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "image"),
    ("llava-hf/llava-1.5-7b-hf", "image"),
    ("meta-llama/Llama-3.2-11B-Vision-Instruct", "image"),
    ("HuggingFaceTB/SmolVLM-Instruct", "image"),
    ("google/gemma-3-4b-it", "image"),
    ("openai/whisper-large-v3", "audio"),
    ("Qwen/Qwen2-Audio-7B-Instruct", "audio"),
]


@functools.cache
def read_configs() -> tuple[dict[str, PretrainedConfig], dict[str, str]]:
    """Every built-in's config, and what is said of each that this transformers cannot read
    (a config published for a newer release): read once, as several test modules collect
    from them."""
    configs: dict[str, PretrainedConfig] = {}
    unreadable: dict[str, str] = {}
    for name in builtin_names():
        try:
            configs[name] = resolve_model(name).config()
        except BadInputError as err:
            unreadable[name] = f"{err.message} {err.hint}"
    return configs, unreadable


def cases() -> tuple[tuple[str, str], ...]:
    """Every built-in this transformers reads, with each modality it takes."""
    configs, _ = read_configs()
    return tuple(
        (name, modality)
        for name, config in configs.items()
        for modality in supported_modalities(config)
    )


def test_a_builtin_this_transformers_cannot_read_asks_for_a_newer_release() -> None:
    """A built-in config the installed transformers cannot read (none on the release CI runs;
    Laguna's on 5.17) ends in one sentence naming the release and the upgrade."""
    for name, message in read_configs()[1].items():
        assert "may be written for a newer transformers release" in message, (name, message)
        assert f"transformers {transformers.__version__}" in message
        assert "pip install -U transformers" in message


@pytest.mark.parametrize(("name", "modality"), cases(), ids=lambda v: str(v))
def test_builtin_traces_and_verifies_or_fails_where_expected(name: str, modality: str) -> None:
    expected = EXPECTED_FAILURES.get((name, modality))
    try:
        report = attempt_trace(name, modality=modality, fix=True)
    except BadInputError as err:
        assert expected is not None and expected[0] == "input", err.message
        assert expected[1] in err.message
        return
    problems = [
        *(report.verification.problems if report.verification else []),
        *(report.structure.differences if report.structure else []),
    ]
    if expected is None:
        assert report.ok, (report.failure and report.failure.exception, problems)
        assert report.verification is not None
        assert report.verification.max_abs_diff <= report.verification.tolerance
        if (name, modality) in FIXED_BY and _needs_its_fix_here(name, modality):
            assert report.applied_fix is not None
            [entry] = report.applied_fix.tracing_ignore
            assert entry.startswith(FIXED_BY[(name, modality)])
            # the working configuration shows what an autowrap moves, whichever step found it
            # (the sweep's seed or the search's own candidate)
            rewrites = [rewrite.entry for rewrite in report.applied_fix.rewrites]
            assert rewrites == ([entry] if entry.startswith("autowrap:") else [])
        return
    assert not report.ok
    if expected[0] == "trace":
        assert report.failure is not None and report.failure.location is not None
        assert report.failure.location.file.endswith(expected[1])
        assert report.failure.location.function == expected[2]
    else:
        assert expected[0] == "verify" and report.traced
        assert any(expected[1] in problem for problem in problems), problems


def _needs_its_fix_here(name: str, modality: str) -> bool:
    """Whether the installed transformers is one that needs ``FIXED_BY``'s fix for the pair."""
    return release(transformers.__version__) >= NEEDED_FROM.get((name, modality), (0, 0))


@pytest.mark.skipif(
    not _needs_its_fix_here("google/gemma-4-26B-A4B", "text"),
    reason="Gemma 4's forward branches on tensor data from transformers "
    f"{dotted(NEEDED_FROM[('google/gemma-4-26B-A4B', 'text')])}",
)
def test_gemma4_fails_in_its_top_level_forward_without_a_fix() -> None:
    report = attempt_trace("google/gemma-4-26B-A4B", modality="text", verify=False)
    assert report.failure is not None and report.failure.location is not None
    assert report.failure.location.file.endswith("modeling_gemma4.py")
    assert report.failure.location.function == "Gemma4ForConditionalGeneration.forward"
    assert report.failure.module_path == ""  # the root: its forward calls every target


def test_required_architectures_are_built_in() -> None:
    assert set(REQUIRED) <= set(cases())


def test_a_model_whose_forward_needs_an_image_refuses_text() -> None:
    """InstructBLIP's forward requires pixel_values: text alone is bad input, not a trace
    failure deep inside transformers."""
    assert supported_modalities(resolve_model("Salesforce/instructblip-flan-t5-xl").config()) == [
        "image"
    ]
    with pytest.raises(BadInputError, match="--modality image"):
        attempt_trace("Salesforce/instructblip-flan-t5-xl", modality="text")


def test_without_no_split_modules_both_stacks_of_an_encoder_decoder_are_targets() -> None:
    report = attempt_trace("microsoft/speecht5_tts", modality="text", verify=False)
    kinds = {path.split(".layers.")[0] for path in report.sequential_targets}
    assert kinds == {"speecht5.encoder.wrapped_encoder", "speecht5.decoder.wrapped_decoder"}
