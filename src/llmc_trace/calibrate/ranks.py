"""Share one subgraph's solves among the ranks of a distributed run, and their results.

Every rank calibrates on its own batches; before any solve, each Hessian becomes the mean over
all ranks' tokens (:func:`merge_hessians`). The solves are then shared out by cost
(:func:`assign_solves`), and each result goes from the rank that computed it to every other
(:func:`share_result`), so all ranks go on with the same compressed weights. One rank alone
does every solve and shares nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from llmc_trace.algorithms.quantize import QuantizedWeight
from llmc_trace.algorithms.scheme import QuantizationScheme
from llmc_trace.core.world import World
from llmc_trace.layers.linear import LinearLayer
from llmc_trace.calibrate.hessians import SharedHessian, Targets
from llmc_trace.calibrate.solve import LayerResult


def merge_hessians(world: World, hessians: Iterable[SharedHessian | None]) -> None:
    """Make every rank's Hessians the mean over all ranks' tokens, each shared one once, in
    the same order everywhere (the targets')."""
    if not world.distributed:
        return
    for entry in {id(e): e for e in hessians if e is not None}.values():
        accumulator = entry.accumulator
        accumulator.num_tokens = world.sum_mean(accumulator.H, accumulator.num_tokens)


def assign_solves(world: World, targets: Targets) -> list[int]:
    """The rank that solves each of ``targets``, balanced by :func:`solve_cost`."""
    return world.owners([solve_cost(layer) for _, layer in targets])


def share_result(
    world: World,
    name: str,
    layer: LinearLayer,
    src: int,
    done: LayerResult | None,
    quantized: dict[str, QuantizedWeight],
    scheme: QuantizationScheme | None,
) -> LayerResult:
    """Give every rank the result rank ``src`` computed for ``name``: the weight left in
    the module and, when quantized, its integers (into ``quantized``); returns its
    :class:`LayerResult`. Only rank 0 keeps the integers (it alone writes the checkpoint)."""
    if not world.distributed:
        assert done is not None
        return done
    kept = quantized.get(name)
    shapes = None
    if kept is not None:
        shapes = [(t.shape, t.dtype) if t is not None else None for t in _stored(kept)]
    done, shapes = world.broadcast_object((done, shapes), src)
    weight = layer.matrix(layer.module.weight.dtype)
    world.broadcast([weight], src)
    layer.set_matrix(weight)
    if shapes is not None:
        if world.rank != src:  # empty tensors of the owner's shapes, to receive into
            int_weight, scale, zero_point, g_idx, global_scale = (
                torch.empty(*s[0], dtype=s[1]) if s else None for s in shapes
            )
            assert int_weight is not None and scale is not None and zero_point is not None
            assert scheme is not None
            kept = QuantizedWeight(
                None, int_weight, scale, zero_point, scheme.weights, g_idx, global_scale
            )
        assert kept is not None
        world.broadcast([t for t in _stored(kept) if t is not None], src)
        if world.is_main:
            quantized[name] = kept
        else:
            quantized.pop(name, None)
    assert done is not None
    return done


def solve_cost(layer: LinearLayer) -> float:
    """Relative time of one GPTQ/SparseGPT solve: the factorisation (in^3) and the sweep
    (out x in x block, with in^2 x out for the lazy updates)."""
    return float(layer.in_features) ** 2 * (layer.in_features + layer.out_features)


def _stored(quantized: QuantizedWeight) -> tuple[torch.Tensor | None, ...]:
    """The tensors of a quantized weight a checkpoint stores, in one fixed order."""
    return (
        quantized.int_weight,
        quantized.scale,
        quantized.zero_point,
        quantized.g_idx,
        quantized.global_scale,
    )
