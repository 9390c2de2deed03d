"""Perplexity of a model, or of a checkpoint folder on a dataset."""

from llmc_trace.evaluate.perplexity import PerplexityResult, perplexity
from llmc_trace.evaluate.run import evaluate_model, load_for_evaluation

__all__ = ["PerplexityResult", "evaluate_model", "load_for_evaluation", "perplexity"]
