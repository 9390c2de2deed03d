"""Perplexity of a model, or of a checkpoint folder on a dataset (text, or text given media)."""

from llmc_trace.evaluate.perplexity import PerplexityResult, perplexity
from llmc_trace.evaluate.run import evaluate_model, evaluate_multimodal, load_for_evaluation

__all__ = [
    "PerplexityResult",
    "evaluate_model",
    "evaluate_multimodal",
    "load_for_evaluation",
    "perplexity",
]
