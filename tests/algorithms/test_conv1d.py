"""GPT-2's ``Conv1D`` (a Linear with its weight stored transposed) is compressed as that Linear."""

from __future__ import annotations

import pytest
import torch
from _compress_data import make_correlated_inputs
from transformers.pytorch_utils import Conv1D

from llmc_trace.algorithms import W4A16, HessianAccumulator, gptq, rtn, sparsegpt
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.algorithms.sparsegpt import Sparsity
from llmc_trace.calibrate.compressor import LayerCompressor

SCHEME = W4A16.with_weights(group_size=32)
IN, OUT = 128, 48


def linear_and_conv1d() -> tuple[torch.nn.Linear, Conv1D]:
    """A seeded Linear and the Conv1D computing the same function (its weight transposed)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(IN, OUT)
    conv = Conv1D(nf=OUT, nx=IN)
    conv.weight.data = linear.weight.data.t().contiguous()  # (in, out)
    conv.bias.data = linear.bias.data.clone()
    return linear, conv


def compress_alone(
    module: torch.nn.Module,
    X: torch.Tensor,
    method: str,
    scheme: QuantizationScheme | None,
    sparsity: Sparsity | None,
) -> LayerCompressor:
    """Calibrate and compress ``module`` as a pipeline would: hooks, one forward, compress."""
    compressor = LayerCompressor(method, scheme, sparsity)
    named = [("layer", module)]
    compressor.on_subgraph_start(0, named)
    with torch.no_grad():
        module(X)
    compressor.on_calibrated(0, named)
    compressor.on_subgraph_end(0, named)
    return compressor


@pytest.mark.parametrize(
    ("method", "scheme", "sparsity"),
    [("gptq", SCHEME, None), ("sparsegpt", None, (2, 4)), ("rtn", SCHEME, None)],
)
def test_conv1d_is_compressed_exactly_as_the_equivalent_linear(
    method: str, scheme: QuantizationScheme | None, sparsity: Sparsity | None
) -> None:
    linear, conv = linear_and_conv1d()
    W = linear.weight.data.clone()  # (out, in)
    X = make_correlated_inputs(256, IN, seed=1).reshape(4, 64, IN)

    # the reference: the algorithm called on the (out, in) matrix and the inputs' Hessian
    hessian = HessianAccumulator(IN)
    hessian.add(X)
    if method == "gptq":
        expected = gptq(W, hessian.H, SCHEME.weights).quantized.weight
    elif method == "sparsegpt":
        expected = sparsegpt(W, hessian.H, (2, 4)).weight
    else:
        expected = rtn(W, SCHEME.weights).weight
    assert not torch.equal(expected, W)

    from_linear = compress_alone(linear, X, method, scheme, sparsity)
    from_conv = compress_alone(conv, X, method, scheme, sparsity)
    assert torch.equal(linear.weight.data, expected)
    assert conv.weight.shape == (IN, OUT) and conv.weight.is_contiguous()  # its own layout
    assert torch.equal(conv.weight.data, expected.t())
    assert [r.loss for r in from_conv.results] == [r.loss for r in from_linear.results]
    if scheme is not None:
        ours, theirs = from_conv.quantized["layer"], from_linear.quantized["layer"]
        assert torch.equal(ours.int_weight, theirs.int_weight)
        assert torch.equal(ours.scale, theirs.scale)
    torch.testing.assert_close(conv(X), linear(X))


def test_two_four_pruning_of_a_conv1d_runs_along_its_inputs() -> None:
    """Its inputs are the stored weight's rows: 2 of every 4 consecutive inputs of an output."""
    _, conv = linear_and_conv1d()
    X = make_correlated_inputs(256, IN, seed=1)
    compress_alone(conv, X, "sparsegpt", None, (2, 4))
    along_inputs = conv.weight.data.t().reshape(-1, 4)  # (out * in / 4, 4)
    assert ((along_inputs == 0).sum(dim=1) == 2).all()
    along_outputs = conv.weight.data.reshape(-1, 4)
    assert not ((along_outputs == 0).sum(dim=1) == 2).all()
