"""Move a tensor to a device, and say when it is already there.

A pipeline moves every group of weights to the execution device and back many times per run;
each move goes through :func:`place`, so the one rule for "already there" holds everywhere.
That rule is not ``tensor.device == device``: a device named without an index
(``torch.device("cuda")``, what ``compress`` is usually given) never equals a tensor's device,
which always has one (``cuda:0``), so such a test takes every tensor for elsewhere. Moves
stayed free only because ``Tensor.to`` returns the tensor itself when nothing changes; a
decision taken on that test (pin, copy, count a transfer) would be wrong on every GPU run.
:func:`resolve` gives the device its index first.
"""

from __future__ import annotations

import torch

#: Where weights and intermediates wait while they are not being computed on.
HOST = torch.device("cpu")


def resolve(device: torch.device) -> torch.device:
    """``device`` with the index its tensors report: an unindexed CUDA device is the
    current one; other devices are left as they are (a CPU tensor's device has no index)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def place(
    tensor: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``tensor`` on ``device``, floating-point values in ``dtype`` when one is given; the
    tensor itself when it is there already (no copy, so ``param.data = place(...)`` is then
    free)."""
    wanted = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    if tensor.device == resolve(device) and tensor.dtype == wanted:
        return tensor
    return tensor.to(device, wanted)
