"""Example values past ``meta``: shapes come out right without full-size arithmetic."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from llmc_trace.tracing.values import MetaMemo, compute_value

WIDTH = 4096
MATRIX_PRODUCTS = {"mm", "addmm", "bmm", "matmul", "linear", "baddbmm"}


class RealProducts(TorchDispatchMode):
    """Records every matrix product that runs on real (non-``meta``) tensors, with its size."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[int] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if func.overloadpacket.__name__ in MATRIX_PRODUCTS and not any(t.is_meta for t in tensors):
            self.elements.append(max(t.numel() for t in tensors))
        return func(*args, **(kwargs or {}))


class CountedTower(torch.nn.Module):
    """A vision-tower-like module: its row count is read from a real tensor as Python numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        rows = [int(n) for n in lengths.tolist()]
        pieces = torch.split(self.proj(hidden), rows)
        return torch.cat([piece.mean(0, keepdim=True) for piece in pieces] + list(pieces))


def meta_tower() -> CountedTower:
    with torch.device("meta"):
        return CountedTower()


def test_meta_module_reading_real_values_runs_no_full_size_product() -> None:
    lengths = torch.tensor([3, 5, 2])
    hidden = torch.empty(10, WIDTH, device="meta")
    tower, counter = meta_tower(), RealProducts()
    with counter:
        computed = compute_value(tower, (hidden, lengths), {}, module=tower, allow_phantoms=True)
    assert computed.error is None
    assert computed.value.shape == (3 + 10, WIDTH) and computed.value.is_meta
    assert computed.beyond_meta  # read from data: the shape is marked as data-dependent
    assert counter.elements == []


def test_values_read_from_meta_tensors_are_guessed_not_refused() -> None:
    """``tolist`` of a ``meta`` tensor gets phantom zeros, as the whole-phantom run would give."""

    def split_by_own_values(x: torch.Tensor) -> torch.Tensor:
        counts = x[:, 0].long().tolist()
        return x.new_zeros(len(counts), sum(counts) + 1)

    x = torch.empty(4, WIDTH, device="meta")
    computed = compute_value(split_by_own_values, (x,), {}, allow_phantoms=True)
    assert computed.value.shape == (4, 1) and computed.beyond_meta


def test_code_the_mixed_run_cannot_execute_falls_back_to_phantoms() -> None:
    """NumPy cannot hold a ``meta`` tensor; the whole-phantom run still answers."""

    def through_numpy(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.numpy()).reshape(-1)

    x = torch.empty(3, 5, device="meta")
    computed = compute_value(through_numpy, (x,), {}, allow_phantoms=True)
    assert computed.error is None and computed.value.shape == (15,) and computed.beyond_meta


def test_without_phantoms_a_value_read_is_an_error() -> None:
    tower = meta_tower()
    hidden = torch.empty(10, WIDTH, device="meta")
    computed = compute_value(tower, (hidden, torch.tensor([10])), {}, module=tower)
    assert computed.value is None and computed.error is not None


def test_meta_memo_answers_repeats_with_the_same_layouts() -> None:
    """A repeated ``meta`` operation is answered from memory, with the very shape, strides and
    dtype the kernel gives; writes into an argument always run."""
    memo = MetaMemo()
    x = torch.empty(2, 8, 6, device="meta", dtype=torch.bfloat16).transpose(1, 2)
    y = torch.empty(6, device="meta")
    with memo:
        first = [x * 2.0, (x + y[:, None]).sum(-1), x.split([2, 4], dim=1)]
    with memo:
        again = [x * 2.0, (x + y[:, None]).sum(-1), x.split([2, 4], dim=1)]
    expected = [x * 2.0, (x + y[:, None]).sum(-1), x.split([2, 4], dim=1)]
    layouts = [
        [(t.shape, t.stride(), t.dtype) for t in tree_flatten(result)[0]]
        for result in (first, again, expected)
    ]
    assert layouts[0] == layouts[1] == layouts[2]
    assert len(memo.results) >= 3 and all(t.is_meta for t in tree_flatten(again)[0])
    with memo:
        grown = torch.empty(3, device="meta").resize_(5)  # mutates its argument: never memoised
    assert grown.shape == (5,)
