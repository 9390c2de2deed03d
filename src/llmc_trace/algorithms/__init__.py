"""Compression algorithms on plain tensors: quantization grids, RTN, GPTQ, SparseGPT.

Nothing here knows about hooks, tracing, files or consoles: functions take a weight, a Hessian
and a scheme, and return tensors. Feed `HessianAccumulator.add` with a layer's inputs, then call
`gptq` or `sparsegpt` with its weight and `H`.

The presets (`W4A16`, `PRESET_NAMES`, ...) are read from compressed-tensors when first used
(PEP 562), as `scheme` reads them: it imports transformers, seconds that a rank accumulating
Hessians or a process sweeping a kernel would pay for nothing.
"""

from typing import Any

from llmc_trace.errors import CheckpointError, CompressionError, HessianError, SchemeError
from llmc_trace.algorithms.gptq import GPTQResult, gptq
from llmc_trace.algorithms.hessian import HessianAccumulator, SweepFactor, sweep_factor
from llmc_trace.algorithms.quantize import (
    QuantizedWeight,
    compute_qparams,
    dequantize,
    fake_quantize,
    quantize_to_int,
    rtn,
)
from llmc_trace.algorithms import scheme as _scheme
from llmc_trace.algorithms.scheme import (
    DEFAULT_IGNORE,
    DEFAULT_TARGETS,
    ActivationArgs,
    QuantizationArgs,
    QuantizationScheme,
    matches,
    resolve_scheme,
)
from llmc_trace.algorithms.sparsegpt import SparseGPTResult, Sparsity, magnitude_prune, sparsegpt

__all__ = [
    "DEFAULT_IGNORE",
    "DEFAULT_SCHEME",
    "DEFAULT_TARGETS",
    "PRESET_NAMES",
    "W4A16",
    "W4A16_ASYM",
    "W8A8",
    "W8A16",
    "CheckpointError",
    "CompressionError",
    "ActivationArgs",
    "GPTQResult",
    "HessianAccumulator",
    "HessianError",
    "QuantizationArgs",
    "QuantizationScheme",
    "QuantizedWeight",
    "SchemeError",
    "SparseGPTResult",
    "SweepFactor",
    "Sparsity",
    "compute_qparams",
    "dequantize",
    "fake_quantize",
    "gptq",
    "magnitude_prune",
    "matches",
    "quantize_to_int",
    "resolve_scheme",
    "rtn",
    "sparsegpt",
    "sweep_factor",
]


def __getattr__(name: str) -> Any:
    """The presets, from `scheme` (which reads them when first used)."""
    if name in _scheme.LAZY_NAMES:
        return getattr(_scheme, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
