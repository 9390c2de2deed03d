"""Calibration data: from a file, a token array or a Hub dataset to padded, masked batches.

`validate_source` checks a source cheaply, before any model is loaded; `load_calibration` turns
it into a `CalibrationSet`; `load_multimodal_calibration` turns rows of images, video or audio
with text into a `MultimodalCalibrationSet` through the model's own processor
(`load_processor`), and `source_modality` says which of the two loaders a source is for; `make_synthetic_text_batches` stands in for data when a model has random
weights. Every failure is a `DataError` carrying a `hint`.
"""

from llmc_trace.data.calibration import CalibrationSet, load_calibration
from llmc_trace.data.multimodal import (
    BatchStats,
    MultimodalCalibrationSet,
    load_multimodal_calibration,
    source_modality,
)
from llmc_trace.data.processor import LoadedProcessor, load_processor
from llmc_trace.errors import DataError
from llmc_trace.data.synthetic import make_synthetic_text_batches
from llmc_trace.data.validation import SourceInfo, validate_source

__all__ = [
    "BatchStats",
    "CalibrationSet",
    "DataError",
    "LoadedProcessor",
    "MultimodalCalibrationSet",
    "SourceInfo",
    "load_calibration",
    "load_multimodal_calibration",
    "load_processor",
    "make_synthetic_text_batches",
    "source_modality",
    "validate_source",
]
