"""``Stage``: one compression method applied to the whole model, the unit a recipe lists.

A run is one or more stages. Each is a complete calibration on the model as the stages before
it left it (the ``independent`` way of running several methods: SparseGPT 2:4 over the whole
model, then GPTQ over the pruned one), so a later stage's Hessians see the earlier stages'
weights. A stage that prunes comes first; one that quantizes ends the run, because quantized
integers are what the checkpoint stores and a later stage would have to change them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmc_trace.algorithms.scheme import QuantizationScheme, resolve_scheme
from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.core.names import (
    ALL_TOKENS,
    AUTO,
    EXPERT_TOKENS,
    GPTQ,
    METHODS,
    PIPELINES,
    PRUNING_METHODS,
    SEQUENTIAL,
)
from llmc_trace.errors import BadInputError


@dataclass(frozen=True)
class Stage:
    """One method over the whole model: the keys and meanings of ``compress``'s flags.

    ``scheme``: the quantization (``None`` to prune only); ``sparsity``: 0.5 or (2, 4)
    (``None`` to quantize only); ``pipeline``: ``auto`` for the memory plan's choice;
    ``propagate_error``, ``true_sequential``, ``refine_passes``: as ``CompressRequest``
    documents them; ``percdamp`` and ``blocksize``: the GPTQ/SparseGPT damping and sweep
    block, recorded so that a recipe pins them. For mixture-of-experts layers:
    ``expert_tokens`` (``all``: every expert's Hessian from every token; ``routed``: only the
    tokens routed to it), ``min_expert_tokens`` (an expert with fewer is rounded to nearest,
    and says so) and ``expert_group`` (at most this many experts calibrated per pass; ``None``:
    all of a layer's at once), as :class:`~llmc_trace.oneshot.compressor.LayerCompressor`
    documents them.
    """

    method: str = GPTQ
    scheme: QuantizationScheme | None = None
    sparsity: Sparsity | None = None
    pipeline: str = AUTO
    propagate_error: bool = True
    true_sequential: bool = False
    refine_passes: int = 0
    percdamp: float = 0.01
    blocksize: int = 128
    expert_tokens: str = ALL_TOKENS
    min_expert_tokens: int = 8
    expert_group: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadInputError(
                f"unknown method {self.method!r}.",
                hint=f"Use one of {', '.join(METHODS)}.",
                param="method",
            )
        if self.method in PRUNING_METHODS and self.sparsity is None:
            raise BadInputError(
                f"{self.method} needs a sparsity.",
                hint="Pass --sparsity 0.5 or 2:4.",
                param="sparsity",
            )
        if self.method not in PRUNING_METHODS and self.scheme is None:
            raise BadInputError(
                f"{self.method} needs a quantization scheme.",
                hint="Pass --scheme W4A16.",
                param="scheme",
            )
        if self.method not in PRUNING_METHODS and self.sparsity is not None:
            raise BadInputError(
                f"{self.method} quantizes and does not prune, but a sparsity was given.",
                hint="Prune in a sparsegpt or magnitude stage before it.",
                param="sparsity",
            )
        if self.pipeline not in (AUTO, *PIPELINES):
            raise BadInputError(
                f"unknown pipeline {self.pipeline!r}.",
                hint=f"Use one of {', '.join((AUTO, *PIPELINES))}.",
                param="pipeline",
            )
        if self.true_sequential and (
            self.pipeline not in (AUTO, SEQUENTIAL) or not self.propagate_error
        ):
            raise BadInputError(
                "true-sequential calibration needs the sequential pipeline with error "
                f"propagation (got pipeline {self.pipeline!r}"
                f"{', no propagation' if not self.propagate_error else ''}).",
                hint="Drop --true-sequential, or use --pipeline sequential without --no-propagate.",
                param="true_sequential",
            )
        if self.refine_passes < 0:
            raise BadInputError(
                f"refine passes must be 0 or more (got {self.refine_passes}).",
                hint="Pass --refine-passes 0 for GPTQ without refinement, or a positive limit.",
                param="refine_passes",
            )
        if not 0 < self.percdamp < 1:
            raise BadInputError(
                f"percdamp must lie in (0, 1) (got {self.percdamp}).",
                hint="0.01 (1 % of the Hessian's mean diagonal) is the usual damping.",
                param="percdamp",
            )
        if self.expert_tokens not in EXPERT_TOKENS:
            raise BadInputError(
                f"unknown expert tokens {self.expert_tokens!r}.",
                hint=f"Use one of {', '.join(EXPERT_TOKENS)}.",
                param="expert_tokens",
            )
        if self.min_expert_tokens < 1:
            raise BadInputError(
                f"min expert tokens must be positive (got {self.min_expert_tokens}).",
                hint="8 is the default; 1 rounds only experts no token reached.",
                param="min_expert_tokens",
            )
        if self.expert_group is not None and self.expert_group < 1:
            raise BadInputError(
                f"the expert group must hold at least one expert (got {self.expert_group}).",
                hint="Leave it unset to calibrate a layer's experts together.",
                param="expert_group",
            )
        if self.blocksize < 1:
            raise BadInputError(
                f"blocksize must be positive (got {self.blocksize}).",
                hint="128 is the usual sweep block.",
                param="blocksize",
            )

    @property
    def prunes(self) -> bool:
        return self.sparsity is not None

    @property
    def quantizes(self) -> bool:
        return self.scheme is not None

    @classmethod
    def parse(
        cls,
        method: str,
        scheme: str | QuantizationScheme | None,
        sparsity: str | float | Sparsity | None,
        **options: object,
    ) -> Stage:
        """A stage from the command line's spellings: a scheme by name (``none`` for no
        quantization), a sparsity as ``0.5`` or ``2:4``."""
        if isinstance(scheme, str):
            scheme = None if scheme.lower() == "none" else resolve_scheme(scheme)
        if not isinstance(sparsity, tuple):
            sparsity = parse_sparsity(sparsity)
        return cls(method, scheme, sparsity, **options)  # type: ignore[arg-type]


def check_order(stages: Sequence[Stage]) -> None:
    """At least one stage, at most one that prunes, and nothing after a stage that quantizes
    (see the module docstring)."""
    if not stages:
        raise BadInputError(
            "the recipe has no stages.",
            hint="List at least one stage, e.g. `stages: [{method: gptq, scheme: W4A16}]`.",
            param="stages",
        )
    pruning = [index for index, stage in enumerate(stages) if stage.prunes]
    if len(pruning) > 1:
        raise BadInputError(
            f"stages {pruning[0] + 1} and {pruning[1] + 1} both prune; a second pruning stage "
            "would choose its own mask and let the first one's weights grow back.",
            hint="Prune once, to the sparsity you want, then quantize.",
            param="stages",
        )
    for index, stage in enumerate(stages[:-1]):
        if stage.quantizes:
            raise BadInputError(
                f"stage {index + 1} ({stage.method}) quantizes, and stage {index + 2} comes "
                "after it; a quantized model cannot be calibrated again.",
                hint="Put the quantizing stage last (prune first, then quantize).",
                param="stages",
            )


def parse_sparsity(text: str | float | None) -> Sparsity | None:
    """``0.5`` (unstructured) or ``2:4`` (N:M); a fraction must lie strictly between 0 and 1."""
    if text is None or text == "":
        return None
    if isinstance(text, str) and ":" in text:
        n_text, _, m_text = text.partition(":")
        if not (n_text.isdigit() and m_text.isdigit()) or not 0 < int(n_text) < int(m_text):
            raise BadInputError(
                f"sparsity {text!r} is not an N:M pattern with 0 < N < M.",
                hint="Use e.g. 2:4, or a fraction such as 0.5.",
                param="sparsity",
            )
        return (int(n_text), int(m_text))
    try:
        value = float(text)
    except ValueError:
        raise BadInputError(
            f"sparsity {text!r} is neither a fraction nor N:M.",
            hint="Use e.g. 0.5 or 2:4.",
            param="sparsity",
        ) from None
    if not 0.0 < value < 1.0:
        raise BadInputError(
            f"sparsity {value} is outside (0, 1).",
            hint="Use a fraction such as 0.5, or N:M such as 2:4.",
            param="sparsity",
        )
    return value
