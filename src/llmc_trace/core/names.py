"""The names users type for methods, pipelines and views, each defined once.

Torch-free on purpose: the command line builds its choices from these without importing the
packages that implement them.
"""

from __future__ import annotations

import re

GPTQ = "gptq"
RTN = "rtn"
SPARSEGPT = "sparsegpt"
MAGNITUDE = "magnitude"
AWQ = "awq"
SMOOTHQUANT = "smoothquant"
#: Compression methods: two that calibrate on data, their data-free baselines, and two that
#: smooth activations into weights (AWQ rounds to the grid after; SmoothQuant only smooths,
#: for a later stage to quantize).
METHODS = (GPTQ, RTN, SPARSEGPT, MAGNITUDE, AWQ, SMOOTHQUANT)
#: Methods that need a Hessian; the others work from weights alone or from activation ranges.
DATA_METHODS = frozenset({GPTQ, SPARSEGPT})
#: Methods that scale smooth -> balance layer pairs (:mod:`llmc_trace.oneshot.smoothing`).
SMOOTHING_METHODS = frozenset({AWQ, SMOOTHQUANT})
#: Methods that calibrate on data, so a stage using one needs a pipeline that runs it.
CALIBRATED_METHODS = DATA_METHODS | SMOOTHING_METHODS
#: Methods that prune (they need a sparsity); the others quantize (they need a scheme).
PRUNING_METHODS = frozenset({SPARSEGPT, MAGNITUDE})
#: The data-free baseline of each method that calibrates: what a compression report measures
#: it against, and what a layer too few tokens reached is compressed with instead.
BASELINE = {GPTQ: RTN, SPARSEGPT: MAGNITUDE}

#: Which tokens an expert's Hessian is built from: every token of the batch, or only those the
#: router sent it (:mod:`llmc_trace.calibrate.compressor`).
ALL_TOKENS = "all"
ROUTED = "routed"
EXPERT_TOKENS = (ALL_TOKENS, ROUTED)

SEQUENTIAL = "sequential"
LAYER_SEQUENTIAL = "layer_sequential"
BASIC = "basic"
DATA_FREE = "data_free"
#: The pipeline the memory plan chooses.
AUTO = "auto"
#: Several stages, each a calibration with its own pipeline on the model the stage before left.
INDEPENDENT = "independent"

#: A few of the quantization presets, for help texts: every compressed-tensors preset is one
#: (``algorithms.scheme.PRESET_NAMES``, read from the installed compressed-tensors).
SCHEMES = ("W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16")
#: Bytes of tensors per checkpoint shard unless told otherwise (transformers' own default).
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9

#: dtypes a model may be compressed or evaluated in; ``auto`` is the one its config declares.
DTYPES = (AUTO, "bfloat16", "float16", "float32")
#: Pipelines that calibrate on data, in order of preference: quality first, then memory.
PREFERENCE = (SEQUENTIAL, LAYER_SEQUENTIAL, BASIC)
PIPELINES = (*PREFERENCE, DATA_FREE)

#: What a sample or a calibration row holds besides text, and text itself.
MODALITIES = ("text", "image", "video", "audio")
#: How a text column holding lists (several captions per image) is read: its first text, each
#: text as its own sample, or all texts of a list joined by newlines into one.
TEXT_LISTS = ("first", "each", "joined")

#: The views ``render`` draws.
VIEWS = ("overview", "detail", "modules", "failure", "source")


def regex_matches(pattern: str, path: str) -> bool:
    """Whether the ``re:<regex>`` ``pattern`` matches the module ``path``: from the start of the
    path (``re.match``), as compressed-tensors, vLLM and llm-compressor read it, so a pattern
    means the same in a recipe, a trace and a checkpoint's ``ignore``. Anchor the end with
    ``$`` to keep a layer's children out (``re:model\\.layers\\.\\d+$``)."""
    return re.match(pattern.removeprefix("re:"), path) is not None


def module_matches(pattern: str, path: str, module: object) -> bool:
    """Whether ``pattern`` names the module ``module`` at ``path``: ``re:`` followed by a
    regular expression matched from the start of the path (:func:`regex_matches`), an exact
    path (``lm_head``), or a class name anywhere in the module's class hierarchy (``Linear``
    matches every subclass of ``nn.Linear``). The one rule for every module pattern a user
    types: sequential targets, ``tracing_ignore`` and a scheme's ``targets``/``ignore``, which
    are also the rules compressed-tensors and vLLM apply when they read a checkpoint."""
    if pattern.startswith("re:"):
        return regex_matches(pattern, path)
    return pattern == path or any(cls.__name__ == pattern for cls in type(module).__mro__)
