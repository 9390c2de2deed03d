"""``SolverSettings``: the options of GPTQ's and SparseGPT's sweep, declared once.

Each field is an option of ``compress`` (:mod:`llmc_trace.core.declare`): its default, its
help and its kind are written here and nowhere else. A
:class:`~llmc_trace.spec.stage.Stage` holds one whole (its ``solver``), and the options are
the stage's, flat: the command line's flag, the recipe's key under the stage, the request's
keyword and the report's record of the stage are each derived from the field. The object
reaches :func:`~llmc_trace.algorithms.gptq.gptq` and
:func:`~llmc_trace.algorithms.sparsegpt.sparsegpt` as it is, so a new option of the sweep is
added here and read there.

It lives in ``core`` because two layers share it: the algorithms below read it, the stage
above declares a run with it; and it imports no torch, as every declaration must not (the
command line reads them to answer ``--help``).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmc_trace.core.declare import Flag, Float, Int, normalize, option


@dataclass(frozen=True)
class SolverSettings:
    """How a GPTQ or SparseGPT sweep runs (see the module docstring).

    ``percdamp`` is the paper's damping, a share of the Hessian's mean diagonal added to it
    (raised tenfold while the factorisation fails; the result records what was used);
    ``blocksize`` the columns of one lazy-update block; ``refine_passes`` bounds GPTQ's
    coordinate-descent refinement after the sweep (0: none, the paper's GPTQ);
    ``static_groups`` says when GPTQ fits a group's scale without act-order (up front, or when
    the sweep reaches the group: :func:`~llmc_trace.algorithms.gptq.gptq` says which suits
    which grid).
    """

    refine_passes: int = option(
        0, "GPTQ: refine by coordinate descent, at most this many passes (e.g. 20).", Int(0)
    )
    percdamp: float = option(
        0.01,
        "GPTQ/SparseGPT damping, a share of the Hessian's mean diagonal.",
        Float(above=0.0, below=1.0),
    )
    blocksize: int = option(128, "GPTQ/SparseGPT: columns per lazy-update block.", Int(1))
    static_groups: bool = option(
        True,
        "GPTQ without act-order: fit each group's scale up front from the original weights "
        "(llm-compressor's way); --no-static-groups fits it when the sweep reaches the group, "
        "as the original GPTQ does (lower error for asymmetric grids).",
        Flag(),
    )

    def __post_init__(self) -> None:
        normalize(self)


#: the declared defaults, for a caller that passes none
DEFAULTS = SolverSettings()
