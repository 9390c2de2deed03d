"""``Stage``: one compression method applied to the whole model, the unit a recipe lists.

A run is one or more stages. Each is a complete calibration on the model as the stages before
it left it (the ``independent`` way of running several methods: SparseGPT 2:4 over the whole
model, then GPTQ over the pruned one), so a later stage's Hessians see the earlier stages'
weights. A stage that prunes comes first; one that quantizes ends the run, because quantized
integers are what the checkpoint stores and a later stage would have to change them again.

Every field is an option of ``compress`` (:mod:`~llmc_trace.core.declare`): its flag, its
key in a recipe's stage and its keyword in a request are the field's name; the solver's
settings (``solver``, a :class:`~llmc_trace.core.solver.SolverSettings`) are options of the
stage too, flat, and reach GPTQ and SparseGPT whole. Torch-free at
import (the schemes load when a stage is made), so the command line answers ``--help`` fast.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmc_trace.core.names import (
    ALL_TOKENS,
    AUTO,
    AWQ,
    CALIBRATED_METHODS,
    DATA_FREE,
    EXPERT_TOKENS,
    GPTQ,
    METHODS,
    PIPELINES,
    PRUNING_METHODS,
    SCHEMES,
    SEQUENTIAL,
    SMOOTHQUANT,
    SPARSEGPT,
)
from llmc_trace.errors import BadInputError
from llmc_trace.core.declare import (
    Flag,
    Float,
    Int,
    Names,
    Parsed,
    Text,
    normalize,
    option,
    section,
)
from llmc_trace.core.solver import SolverSettings

if TYPE_CHECKING:
    from llmc_trace.algorithms.scheme import QuantizationScheme
    from llmc_trace.algorithms.sparsegpt import Sparsity

SCHEME_KEYS = ("name", "weights", "input_activations", "targets", "ignore")


@dataclass(frozen=True)
class Stage:
    """One method over the whole model (see the module docstring).

    ``method`` and ``scheme`` may be ``auto``: the method is SparseGPT when a sparsity is
    given and GPTQ otherwise; the scheme is W4A16 for a method that quantizes and none for
    one that prunes. After construction both are resolved (``scheme`` a
    :class:`QuantizationScheme` or ``None``, ``sparsity`` a fraction, an ``(N, M)`` pair or
    ``None``), and ``scheme.ignore`` holds ``ignore`` too.
    """

    method: str = option(
        AUTO,
        "gptq, rtn, sparsegpt, magnitude, awq, or smoothquant (a stage before gptq or rtn) "
        "(auto: sparsegpt when --sparsity is given, else gptq).",
        Text(choices=(AUTO, *METHODS)),
    )
    #: given as a preset's name, ``auto``, ``none``, a recipe's mapping or a scheme; always a
    #: scheme (or ``None``) once constructed
    scheme: QuantizationScheme | None = option(
        AUTO,
        f"A compressed-tensors preset ({', '.join(SCHEMES)}, MXFP4A16, W4A8, ...) or 'none' "
        f"(auto: {SCHEMES[0]} for a method that quantizes, none for one that prunes); a recipe "
        "may give the full mapping.",
        Parsed(lambda value: _scheme_spelling(value), lambda value: _scheme_mapping(value)),
    )
    #: given as text (``0.5``, ``2:4``) or a value; always a fraction, a pair or ``None``
    sparsity: Sparsity | None = option(
        None,
        "Fraction such as 0.5, or N:M such as 2:4.",
        Parsed(lambda value: parse_sparsity(value), lambda value: _sparsity_text(value)),
    )
    pipeline: str = option(
        AUTO, "auto: the memory plan's choice.", Text(choices=(AUTO, *PIPELINES))
    )
    propagate: bool = option(
        True,
        "Rerun each compressed subgraph so later ones calibrate on compressed outputs (error "
        "propagation).",
        Flag(),
        renamed_from=("propagate_error",),
    )
    true_sequential: bool = option(
        False,
        "Calibrate each layer's projections in dependency stages (sequential pipeline).",
        Flag(),
    )
    #: GPTQ's and SparseGPT's sweep (damping, block size, refinement): options of the stage,
    #: flat, declared in :class:`~llmc_trace.core.solver.SolverSettings`
    solver: SolverSettings = section(SolverSettings)
    expert_tokens: str = option(
        ALL_TOKENS,
        "MoE: build each expert's Hessian from every token, or only those routed to it.",
        Text(choices=EXPERT_TOKENS),
    )
    min_expert_tokens: int = option(
        8, "MoE: an expert with fewer tokens is rounded to nearest (and named).", Int(1)
    )
    expert_group: int | None = option(
        None,
        "MoE: calibrate at most this many experts per pass (bounds the Hessians alive).",
        Int(1, optional=True),
    )
    group_size: int | None = option(
        None,
        "Columns sharing a scale, overriding the scheme's (e.g. 32 where no layer width takes "
        "128); 0 gives one scale per output channel.",
        Int(0, optional=True),
    )
    towers: bool = option(
        False,
        "Compress a multimodal model's vision and audio towers and their projectors too (by "
        "default they stay in full precision, as served checkpoints keep them).",
        Flag(),
        every_stage=True,
    )
    smoothing_strength: float = option(
        0.5,
        "SmoothQuant: alpha, the share of the activations' range moved into the weights "
        "(0 to 1; higher for models with larger activation outliers).",
        Float(),
    )
    n_grid: int = option(20, "AWQ: ratios searched for each pair's scales (in [0, 1)).", Int(2))
    duo_scaling: bool = option(
        True,
        "AWQ: scale by the activations' and the weights' mean magnitudes (else the "
        "activations' alone).",
        Flag(),
    )
    apply_clip: bool = option(
        True,
        "AWQ: before rounding, clip each quantization group's range to the shrink that "
        "minimises its layer's output error on the calibration inputs (as AWQ's authors do).",
        Flag(),
    )
    clip_max_shrink: float = option(
        0.5,
        "AWQ clipping: a group's range is cut in steps of 5 %, by less than this share "
        "(0.05 to 0.95; 0.5 tries 1 down to 0.55, as AWQ's authors do).",
        Float(),
    )
    ignore: tuple[str, ...] = option(
        (),
        "Layers to keep in full precision: module paths (as report.html lists them), class "
        "names or 're:' patterns, added to the scheme's ignore list (comma-separated or "
        "repeated).",
        Names(),
        short="-i",
        every_stage=True,
    )

    def __post_init__(self) -> None:
        normalize(self)
        sparsity = self.sparsity
        method = self.method
        if method == AUTO:
            method = SPARSEGPT if sparsity is not None else GPTQ
        scheme = self.scheme
        if isinstance(scheme, str) or isinstance(scheme, Mapping):
            scheme = _read_scheme(scheme, method)
        if scheme is not None and self.group_size is not None:
            if scheme.weights.is_float:
                raise BadInputError(
                    f"--group-size changes an integer scheme's groups, and {scheme.name}'s "
                    "scales are fixed by its float format.",
                    hint="Leave out --group-size, or use an integer scheme such as W4A16.",
                    param="group_size",
                )
            scheme = (
                scheme.with_weights(strategy="channel", group_size=None)
                if self.group_size == 0
                else scheme.with_weights(strategy="group", group_size=self.group_size)
            )
        if scheme is not None and self.ignore:
            kept = tuple(dict.fromkeys((*scheme.ignore, *self.ignore)))
            scheme = dataclasses.replace(scheme, ignore=kept)
        for name, value in (("method", method), ("scheme", scheme), ("sparsity", sparsity)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "ignore", tuple(self.ignore))
        _check(self)

    @property
    def prunes(self) -> bool:
        return self.sparsity is not None

    @property
    def quantizes(self) -> bool:
        return self.scheme is not None

    @property
    def only_smooths(self) -> bool:
        """A SmoothQuant stage: it changes weights without pruning or quantizing them."""
        return self.method == SMOOTHQUANT


def _check(stage: Stage) -> None:
    """Combinations the kinds alone cannot check (each value's own range is its kind's)."""
    if stage.method in PRUNING_METHODS and stage.sparsity is None:
        raise BadInputError(
            f"{stage.method} needs a sparsity.",
            hint="Pass --sparsity 0.5 or 2:4.",
            param="sparsity",
        )
    _check_smoothing(stage)
    if stage.method not in PRUNING_METHODS and stage.scheme is None and not stage.only_smooths:
        raise BadInputError(
            f"{stage.method} needs a quantization scheme.",
            hint="Pass --scheme W4A16.",
            param="scheme",
        )
    activations = stage.scheme.input_activations if stage.scheme is not None else None
    if activations is not None and activations.calibrated:
        raise BadInputError(
            f"{stage.scheme.name} quantizes input activations with static scales observed on "
            "calibration data, which llmc-trace does not calibrate.",
            hint="Use the dynamic variant (FP8_DYNAMIC for FP8, NVFP4A16 for NVFP4's weights), "
            "whose activation scales vLLM computes per token at run time.",
            param="scheme",
        )
    if stage.method not in PRUNING_METHODS and stage.sparsity is not None:
        raise BadInputError(
            f"{stage.method} quantizes and does not prune, but a sparsity was given.",
            hint="Prune in a sparsegpt or magnitude stage before it.",
            param="sparsity",
        )
    if stage.ignore and stage.scheme is None:
        raise BadInputError(
            "--ignore keeps layers out of quantization, and this run only prunes.",
            hint="Leave out --ignore, or give the run a --scheme.",
            param="ignore",
        )
    for pattern in stage.ignore:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern.removeprefix("re:"))
            except re.error as err:
                raise BadInputError(
                    f"--ignore {pattern!r} is not a valid regular expression ({err}).",
                    hint="Write 're:' followed by a Python regular expression.",
                    param="ignore",
                ) from None
    if stage.pipeline == DATA_FREE and stage.method in CALIBRATED_METHODS:
        raise BadInputError(
            f"{stage.method} calibrates on data, and the data_free pipeline runs none.",
            hint="Leave --pipeline to the plan (auto), or compress without data: --method rtn "
            "(quantizing) or magnitude (pruning).",
            param="pipeline",
        )
    if stage.true_sequential and (stage.pipeline not in (AUTO, SEQUENTIAL) or not stage.propagate):
        raise BadInputError(
            "true-sequential calibration needs the sequential pipeline with error "
            f"propagation (got pipeline {stage.pipeline!r}"
            f"{', no propagation' if not stage.propagate else ''}).",
            hint="Drop --true-sequential, or use --pipeline sequential without --no-propagate.",
            param="true_sequential",
        )


def _check_smoothing(stage: Stage) -> None:
    """SmoothQuant leaves quantizing to a later stage; AWQ rounds weights only, to integers."""
    if stage.only_smooths and stage.scheme is not None:
        raise BadInputError(
            "smoothquant only smooths; the scheme belongs to the stage that quantizes after it.",
            hint="List a gptq or rtn stage with --scheme after the smoothquant stage.",
            param="scheme",
        )
    if (
        stage.method == AWQ
        and stage.scheme is not None
        and (stage.scheme.input_activations is not None or stage.scheme.weights.num_bits > 8)
    ):
        raise BadInputError(
            f"awq quantizes weights only, to integers, and {stage.scheme.name} is not such a "
            "scheme.",
            hint="Use W4A16, W4A16_ASYM or W8A16 (for W8A8, put smoothquant before gptq).",
            param="scheme",
        )
    if not 0.05 <= stage.clip_max_shrink <= 0.95:
        raise BadInputError(
            f"clip_max_shrink {stage.clip_max_shrink} is outside [0.05, 0.95].",
            hint="0.5 (a group's range cut by at most half) is AWQ's; --no-apply-clip turns "
            "clipping off.",
            param="clip_max_shrink",
        )
    if not 0.0 <= stage.smoothing_strength <= 1.0:
        raise BadInputError(
            f"smoothing_strength {stage.smoothing_strength} is outside [0, 1].",
            hint="0.5 is SmoothQuant's usual strength; 0.8 for larger outliers.",
            param="smoothing_strength",
        )


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


def parse_sparsity(text: object) -> Sparsity | None:
    """``0.5`` (unstructured) or ``2:4`` (N:M); a fraction must lie strictly between 0 and 1."""
    if text is None or text == "":
        return None
    if isinstance(text, tuple):
        text = f"{text[0]}:{text[1]}"
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
        if isinstance(text, bool):
            raise TypeError
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
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


def _scheme_spelling(value: object) -> object:
    """A scheme as written (a name or a mapping), kept as it is: the stage resolves it,
    since ``auto`` depends on the stage's method."""
    from llmc_trace.algorithms.scheme import QuantizationScheme

    if value is not None and not isinstance(value, (str, Mapping, QuantizationScheme)):
        raise ValueError(f"must be a preset's name or a mapping, not {value!r}")
    return value


def _read_scheme(value: object, method: str = GPTQ) -> QuantizationScheme | None:
    """A scheme as a request, a recipe or the command line gives it: a preset's name,
    ``none``, ``auto`` (the method's default), the full mapping a written recipe holds, or a
    :class:`QuantizationScheme`."""
    from llmc_trace.algorithms.scheme import (
        DEFAULT_IGNORE,
        DEFAULT_SCHEME,
        DEFAULT_TARGETS,
        ActivationArgs,
        QuantizationArgs,
        QuantizationScheme,
        resolve_scheme,
    )

    if value is None or isinstance(value, QuantizationScheme):
        return value
    if isinstance(value, str):
        if value.lower() == "none":
            return None
        if value == AUTO:
            return None if method in PRUNING_METHODS or method == SMOOTHQUANT else DEFAULT_SCHEME
        if method == SPARSEGPT:  # it sweeps in input order: the preset without our act-order
            return resolve_scheme(value).with_weights(actorder=None)
        return resolve_scheme(value)
    if not isinstance(value, Mapping):
        raise BadInputError(
            "`scheme` must be a preset's name or a mapping.",
            hint="Use e.g. W4A16, or the mapping a written recipe.yaml has.",
            param="scheme",
        )
    unknown = [key for key in value if key not in SCHEME_KEYS]
    missing = [key for key in ("name", "weights") if key not in value]
    if unknown or missing:
        raise BadInputError(
            f"the scheme has {'an unknown key ' + repr(unknown[0]) if unknown else 'no ' + repr(missing[0])}.",
            hint=f"A scheme mapping has {', '.join(SCHEME_KEYS)}.",
            param="scheme",
        )
    activations = value.get("input_activations")
    names = Names()
    try:
        return QuantizationScheme(
            str(value["name"]),
            QuantizationArgs(**value["weights"]),
            ActivationArgs(**activations) if activations is not None else None,
            names.read(value.get("targets", DEFAULT_TARGETS)),
            names.read(value.get("ignore", DEFAULT_IGNORE)),
        )
    except BadInputError:  # a weight argument of the wrong kind or value, said as such
        raise
    except (TypeError, ValueError) as err:  # an unknown argument, targets that are no names
        raise BadInputError(
            f"the scheme's arguments are not valid ({err}).",
            hint="Use the keys and kinds a written recipe.yaml has.",
            param="scheme",
        ) from None


def _scheme_mapping(scheme: QuantizationScheme | str | None) -> object:
    """A resolved scheme as a written recipe holds it: the full mapping (a name, such as the
    declared default ``auto``, stays a name)."""
    if scheme is None or isinstance(scheme, str):
        return scheme
    activations = scheme.input_activations
    return {
        "name": scheme.name,
        "weights": dataclasses.asdict(scheme.weights),
        "input_activations": None if activations is None else dataclasses.asdict(activations),
        "targets": list(scheme.targets),
        "ignore": list(scheme.ignore),
    }


def _sparsity_text(sparsity: Sparsity | None) -> object:
    return f"{sparsity[0]}:{sparsity[1]}" if isinstance(sparsity, tuple) else sparsity
