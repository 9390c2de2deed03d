"""Inputs for the compression tests: seeded correlated activations and captured layer inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from llmc_trace.algorithms import HessianAccumulator


def make_correlated_inputs(tokens: int, features: int, seed: int) -> torch.Tensor:
    """(tokens, features) inputs with correlated channels and a few outlier channels.

    Like real layer inputs: a random mixing matrix with a decaying spectrum correlates the
    channels, and 2 % of channels are scaled up 10x.
    """
    generator = torch.Generator().manual_seed(seed)
    spectrum = torch.logspace(0, -2, features)
    mixing = torch.randn(features, features, generator=generator) * spectrum[:, None]
    X = torch.randn(tokens, features, generator=generator) @ mixing
    X = X + 0.05 * torch.randn(tokens, features, generator=generator)
    outliers = torch.randperm(features, generator=generator)[: max(features // 50, 1)]
    X[:, outliers] *= 10
    return X


@dataclass(frozen=True)
class LayerInputs:
    """A refmodel layer's weight with the inputs it saw on calibration and evaluation rows."""

    name: str
    W: torch.Tensor  # (out, in)
    X_calib: torch.Tensor  # (tokens, in)
    X_eval: torch.Tensor  # (tokens, in)


def capture_inputs(model: torch.nn.Module, name: str, tokens: np.ndarray) -> torch.Tensor:
    """Inputs of module `name` during a forward pass over `tokens`, via a forward hook."""
    captured: list[torch.Tensor] = []
    module = model.get_submodule(name)
    hook = module.register_forward_hook(lambda mod, args, out: captured.append(args[0]))
    try:
        with torch.no_grad():
            model(input_ids=torch.as_tensor(tokens, dtype=torch.long))
    finally:
        hook.remove()
    return torch.cat(captured).reshape(-1, module.in_features)


def hessian(X: torch.Tensor) -> torch.Tensor:
    """H = 2 X^T X / n of the inputs `X` (tokens, in), as the compressor accumulates it."""
    acc = HessianAccumulator(X.shape[1])
    acc.add(X)
    return acc.H


def output_error(W: torch.Tensor, Q: torch.Tensor, X: torch.Tensor) -> float:
    """||W X^T - Q X^T||^2 per token: the error GPTQ and SparseGPT minimise, measured directly."""
    return ((W.float() - Q.float()) @ X.T).pow(2).sum().item() / X.shape[0]
