"""What share of a model's weights a compression run touched, by kind of layer.

A run that exits 0 can still leave most of a model in full precision: the fused experts of an
MoE model once were never targeted, and nothing said so. After every run the parameters of
each kind (attention, dense MLP, experts, routers, embeddings, head) are counted as compressed
or left, so the console can say plainly when more than half of the linear-like weights were not
touched. A multimodal model's towers and projector are counted apart from its language model
(:mod:`llmc_trace.models.parts`), one row each for their linear layers, whatever their kinds:
kept in full precision by default, they would otherwise pass for untouched attention and MLP
weights. Their position tables join the embeddings.

Any other weight matrix (a parameter of two or more dimensions that no linear layer or
embedding holds, biases aside: fused experts keep theirs per expert) is counted as left: experts
that a release of transformers lays out its own way (Aria's grouped GEMMs on 5.17) are then a
large untouched ``experts`` row, not a share of the model that no row shows.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from llmc_trace.layers.linear import as_linear
from llmc_trace.models.parts import TOWER_PARTS, ModelParts, model_parts
from llmc_trace.moe import ExpertProjection

KINDS = ("attention", "dense MLP", "experts", "router", "embeddings", "head", "other")
#: Every row's kind, in the order rows are listed: the language model's kinds, then its towers.
ROWS = (*KINDS, *TOWER_PARTS)

_ATTENTION = ("attn", "attention", "mixer", "q_proj", "k_proj", "v_proj", "o_proj", "qkv")
_MLP = ("mlp", "feed_forward", "ffn", "fc1", "fc2", "shared_expert", "dense")


@dataclass(frozen=True)
class KindCoverage:
    """Weights of one kind of layer (or of one tower): how many were compressed, of how many."""

    kind: str
    compressed: int
    total: int


def kind_of(name: str, module: torch.nn.Module, routers: Collection[str]) -> str:
    """The kind of layer ``name`` is, from its class and path."""
    if isinstance(module, ExpertProjection):
        return "experts"
    if name in routers:
        return "router"
    if "experts" in name.split("."):
        return "experts"
    if isinstance(module, torch.nn.Embedding):
        return "embeddings"
    if name.rpartition(".")[2] in ("lm_head", "output", "head"):
        return "head"
    parts = name.split(".")
    if any(any(word in part for word in _ATTENTION) for part in parts):
        return "attention"
    if any(any(word in part for word in _MLP) for part in parts):
        return "dense MLP"
    return "other"


def parameter_coverage(
    model: torch.nn.Module,
    compressed: Collection[str],
    routers: Collection[str] = (),
    parts: ModelParts | None = None,
) -> list[KindCoverage]:
    """Weights of every linear-like layer (experts one by one) and embedding of ``model``, and
    its other weight matrices (convolutions, routers held as parameters, experts in a layout
    not read), by kind of the language model's layers and by tower, with how many belong to
    the layers named in ``compressed``; rows with no weights are left out. Shapes alone are
    read: works on a skeleton on ``meta``."""
    parts = parts or model_parts(model)
    totals = dict.fromkeys(ROWS, 0)
    done = dict.fromkeys(ROWS, 0)
    seen: set[int] = set()  # the parameters counted (a fused one through its experts' views)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding):
            weight = module.weight
        elif (layer := as_linear(module)) is not None:
            weight = layer.module.weight
        else:
            continue
        if isinstance(module, ExpertProjection):
            seen.add(id(module.fused))
        else:
            if id(weight) in seen:  # a tied head counts once, as its embedding
                continue
            seen.add(id(weight))
        row = _row(name, module, routers, parts)
        totals[row] += weight.numel()
        if name in compressed:
            done[row] += weight.numel()
    for name, parameter in model.named_parameters():
        if parameter.dim() >= 2 and id(parameter) not in seen and not name.endswith("bias"):
            owner = name.rpartition(".")[0]
            totals[_row(owner, model.get_submodule(owner), routers, parts)] += parameter.numel()
    return [KindCoverage(k, done[k], totals[k]) for k in ROWS if totals[k]]


def _row(name: str, module: torch.nn.Module, routers: Collection[str], parts: ModelParts) -> str:
    """The row a weight of module ``name`` counts in: its tower's (the embeddings aside), or its
    kind's."""
    part = parts.part_of(name)
    if part in TOWER_PARTS and not isinstance(module, torch.nn.Embedding):
        return part
    return kind_of(name, module, routers)


def untouched_share(coverage: list[KindCoverage]) -> float:
    """The share of the language model's linear-like weights (embeddings aside) no method
    touched: towers are kept on purpose, and said so apart."""
    rows = [row for row in coverage if row.kind not in ("embeddings", *TOWER_PARTS)]
    total = sum(row.total for row in rows)
    return 1 - sum(row.compressed for row in rows) / total if total else 0.0
