"""Calibration data: from a file, a token array or a Hub dataset to padded, masked batches.

`validate_source` checks a source cheaply, before any model is loaded; `load_calibration` turns
it into a `CalibrationSet`; `make_synthetic_text_batches` stands in for data when a model has
random weights. Every failure is a `DataError` carrying a `hint`.
"""

from llmc_trace.data.calibration import CalibrationSet, load_calibration
from llmc_trace.errors import DataError
from llmc_trace.data.synthetic import make_synthetic_text_batches
from llmc_trace.data.validation import SourceInfo, validate_source

__all__ = [
    "CalibrationSet",
    "DataError",
    "SourceInfo",
    "load_calibration",
    "make_synthetic_text_batches",
    "validate_source",
]
