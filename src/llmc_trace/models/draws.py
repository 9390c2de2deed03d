"""Random weights for tiny twins, read from a pool of draws instead of drawn one by one.

A twin needs random weights, not fresh ones: verification compares a replay with the eager
forward on the same weights, whatever they are. Drawing them was most of a twin's build time
(torch's CPU generator makes about 100 million normal values a second, and a twin of a wide
model holds 100 million weights), and twins are built for every trace that is verified.

Inside :func:`pooled_draws`, ``Tensor.normal_`` and ``Tensor.uniform_`` (what every
``torch.nn.init`` function and transformers' initialization call) copy consecutive values of a
pool drawn once, starting at an offset drawn from the global generator: as seeded as before,
scaled to the requested mean and spread or bounds, at the cost of a copy. The pool's length is
a prime larger than any row, so no two rows of a matrix with fewer rows than that repeat each
other. Calls given their own ``generator`` draw as they always did.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

#: The pool's length: a prime, and wider than any weight's row.
POOL_SIZE = 1_048_573
#: The pools' own seed: the same values in every process.
POOL_SEED = 20_240_601


@functools.cache
def _pool(kind: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(POOL_SEED)
    return getattr(torch.empty(POOL_SIZE), f"{kind}_")(generator=generator)


def _fill_from_pool(tensor: torch.Tensor, kind: str) -> None:
    """``tensor`` filled with the pool's values from a random offset, wrapping around."""
    flat = tensor.view(-1)
    pool = _pool(kind)
    start = int(torch.randint(POOL_SIZE, (1,)).item())
    filled = 0
    while filled < flat.numel():
        count = min(flat.numel() - filled, POOL_SIZE - start)
        flat[filled : filled + count].copy_(pool[start : start + count])
        filled += count
        start = 0


#: Each method's two parameters, as torch names them, with their defaults.
PARAMETERS = {"normal": {"mean": 0.0, "std": 1.0}, "uniform": {"from": 0.0, "to": 1.0}}


def _pooled(kind: str, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``original`` (``Tensor.normal_`` or ``Tensor.uniform_``) reading the pool where it can."""

    def draw(tensor: torch.Tensor, *args: float, **kwargs: object) -> torch.Tensor:
        poolable = (
            kwargs.get("generator") is None
            and tensor.is_contiguous()
            and tensor.is_floating_point()
            and tensor.device.type == "cpu"
        )
        if not poolable:
            return original(tensor, *args, **kwargs)
        kwargs.pop("generator", None)
        values = {**PARAMETERS[kind], **dict(zip(PARAMETERS[kind], args, strict=False)), **kwargs}
        first, second = (float(values[name]) for name in PARAMETERS[kind])
        with torch.no_grad():
            _fill_from_pool(tensor, kind)
            # normal_: std * z + mean; uniform_: (to - from) * u + from
            scale = second if kind == "normal" else second - first
            if scale != 1.0:
                tensor.mul_(scale)
            return tensor.add_(first) if first else tensor

    return draw


@contextlib.contextmanager
def pooled_draws() -> Iterator[None]:
    """Within the block, ``Tensor.normal_`` and ``Tensor.uniform_`` read the pools (see the
    module docstring). Not thread-safe: twins are built on one thread."""
    originals = {kind: getattr(torch.Tensor, f"{kind}_") for kind in PARAMETERS}
    for kind, original in originals.items():
        setattr(torch.Tensor, f"{kind}_", _pooled(kind, original))
    try:
        yield
    finally:
        for kind, original in originals.items():
            setattr(torch.Tensor, f"{kind}_", original)
