"""Example values past ``meta``: shapes come out right without full-size arithmetic."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from llmc_trace.tracing.values import MetaMemo, MixedExecution, PhantomProducts, compute_value

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


class ProjectedThroughNumpy(torch.nn.Module):
    """A bfloat16 projection whose output goes through NumPy: only the whole-phantom run runs it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.proj(x).float().numpy()).reshape(-1)


def test_a_model_run_whole_on_phantoms_runs_no_product_of_phantoms() -> None:
    with torch.device("meta"):
        model = ProjectedThroughNumpy()
    counter = RealProducts()
    x = torch.empty(38, WIDTH, device="meta", dtype=torch.bfloat16)
    with counter:
        computed = compute_value(model, (x,), {}, module=model, allow_phantoms=True)
    assert computed.error is None and computed.value.shape == (38 * WIDTH,)
    assert computed.beyond_meta and counter.elements == []


def test_products_with_a_phantom_operand_give_what_the_dense_product_gives() -> None:
    """Zeros, plus the bias a fused product adds; an operand repeating a non-zero value is no
    phantom and is multiplied as it is."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=generator).to(torch.bfloat16)
    bias = torch.randn(32, generator=generator).to(torch.bfloat16)
    phantom = torch.zeros((), dtype=torch.bfloat16).expand(32, 64)
    twos = torch.full((), 2.0, dtype=torch.bfloat16).expand(32, 64)
    batched = torch.zeros((), dtype=torch.bfloat16).expand(3, 64, 5)
    with PhantomProducts():
        got = [
            torch.nn.functional.linear(x, phantom, bias),
            torch.nn.functional.linear(x, phantom),
            torch.bmm(x, batched),
            torch.baddbmm(bias[:5], x, batched),
            torch.nn.functional.linear(x, twos, bias),
        ]
    expected = [
        torch.nn.functional.linear(x, phantom.contiguous(), bias),
        torch.nn.functional.linear(x, phantom.contiguous()),
        torch.bmm(x, batched.contiguous()),
        torch.baddbmm(bias[:5], x, batched.contiguous()),
        torch.nn.functional.linear(x, twos.contiguous(), bias),
    ]
    for mine, dense in zip(got, expected):
        assert mine.dtype == dense.dtype and torch.equal(mine, dense)


def test_sizes_that_pass_through_meta_keep_their_values() -> None:
    """Sizes copied to the features' device and token slots made there are read back for
    real (Mistral 3 splits its features so; LFM2-VL keeps an image's tokens by such a mask),
    where phantoms would read 0."""
    features = torch.empty(8, WIDTH, device="meta")
    sizes = torch.tensor([[4, 6], [2, 4]])
    with MixedExecution():
        split = (torch.as_tensor(sizes, device=features.device) // 2).prod(-1).tolist()
        parts = torch.split(features, split)
        slots = torch.arange(5, device="meta")
        kept = features[:5][slots < torch.tensor(3)]
    assert split == [6, 2]
    assert [p.shape for p in parts] == [(6, WIDTH), (2, WIDTH)] and all(p.is_meta for p in parts)
    assert kept.shape == (3, WIDTH) and kept.is_meta


def test_values_of_meta_activations_are_never_invented() -> None:
    """What follows from a ``meta`` activation is guessed as phantoms are (zeros), and a kept
    value written to from one is dropped, not left stale."""
    hidden = torch.empty(4, WIDTH, device="meta")
    with MixedExecution() as mode:
        summed = hidden.sum(-1)
        positive = (summed > 0).nonzero()
        slots = torch.arange(4, device="meta")
        before = slots.tolist()
        slots.copy_(summed.long())
        after = slots.tolist()
    assert summed not in mode.known and positive.shape == (0, 1)
    assert before == [0, 1, 2, 3] and after == [0, 0, 0, 0]


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
