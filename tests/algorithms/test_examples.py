"""The runnable examples in the docstrings of algorithms/, checkpoint/, layers/ and the
intermediates cache still run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "llmc_trace.algorithms.scheme",
    "llmc_trace.algorithms.hessian",
    "llmc_trace.algorithms.gptq",
    "llmc_trace.algorithms.refine",
    "llmc_trace.checkpoint.pack",
    "llmc_trace.checkpoint.writer",
    "llmc_trace.layers.linear",
    "llmc_trace.pipelines.cache",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
