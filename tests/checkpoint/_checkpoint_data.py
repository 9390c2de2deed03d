"""The reference model for the checkpoint tests: loading it, its Hessians, and perplexity; and
which checkpoints the installed transformers loads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from llmc_trace.algorithms import HessianAccumulator, QuantizationScheme
from llmc_trace.core.versions import release
from llmc_trace.models.build import QUANTIZES_NOTHING_LOADS

#: transformers loads a checkpoint that quantizes no weights (sparsity alone) from 5.23 on;
#: llmc-trace refuses one before (test_writer checks the refusal on every release)
loads_sparse_only = pytest.mark.skipif(
    release(transformers.__version__) < QUANTIZES_NOTHING_LOADS,
    reason=f"transformers {transformers.__version__} cannot load a sparsity-only checkpoint",
)


def load_refmodel(folder: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def eval_tokens(folder: Path, rows: int = 4, length: int = 256) -> torch.Tensor:
    return torch.as_tensor(np.load(folder / "eval.npy")[:rows, :length], dtype=torch.long)


def layer_hessians(
    model: torch.nn.Module, scheme: QuantizationScheme, tokens: np.ndarray
) -> dict[str, torch.Tensor]:
    """H of every module the scheme targets, from one forward pass of the unquantized model."""
    accumulators: dict[str, HessianAccumulator] = {}
    hooks = []
    for name, module in model.named_modules():
        if scheme.is_target(name, module):
            accumulators[name] = HessianAccumulator(module.in_features)
            hooks.append(
                module.register_forward_hook(
                    lambda mod, args, out, name=name: accumulators[name].add(args[0])
                )
            )
    try:
        with torch.no_grad():
            model(input_ids=torch.as_tensor(tokens, dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    return {name: acc.H for name, acc in accumulators.items()}


@torch.no_grad()
def perplexity(model: torch.nn.Module, tokens: torch.Tensor) -> float:
    """exp of the mean next-token NLL, as the refmodel README computes it."""
    logp = torch.log_softmax(model(input_ids=tokens).logits.float()[:, :-1], dim=-1)
    nll = -logp.gather(-1, tokens[:, 1:, None]).sum().item()
    return math.exp(nll / tokens[:, 1:].numel())
