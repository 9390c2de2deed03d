"""See every layer that computes ``x Wᵀ + b`` as one linear layer, whatever its weight layout.

GPTQ, SparseGPT and round-to-nearest work on a weight of shape ``(out, in)`` whose Hessian is
``in × in``, which is how ``torch.nn.Linear`` stores it. ``transformers.pytorch_utils.Conv1D``
(GPT-2, GPT, and models built on them) computes the same function but stores the weight
transposed, ``(in, out)``, with forward ``x W + b``. Whatever takes a layer's weight to compress
it, or sizes a layer, goes through :func:`as_linear`: the algorithms then see one orientation,
and the result goes back in the module's own layout, so nothing else needs to know which class
a target is.

>>> from transformers.pytorch_utils import Conv1D
>>> layer = as_linear(Conv1D(nf=6, nx=4))  # 4 inputs, 6 outputs, weight stored (4, 6)
>>> layer.in_features, layer.out_features, tuple(layer.matrix(torch.float32).shape)
(4, 6, (6, 4))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LinearLayer:
    """A module seen as a linear layer: its widths and its weight as an ``(out, in)`` matrix.

    ``transposed`` says the module stores the weight as ``(in, out)`` (a ``Conv1D``);
    ``in_place`` that its weight is a view of a larger parameter (a :class:`LinearView`), which
    a result is written into.
    """

    module: torch.nn.Module
    transposed: bool
    in_place: bool = False

    @property
    def in_features(self) -> int:
        return int(self.module.weight.shape[0 if self.transposed else 1])

    @property
    def out_features(self) -> int:
        return int(self.module.weight.shape[1 if self.transposed else 0])

    def matrix(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a contiguous ``(out, in)`` matrix in ``dtype``: the module's own tensor
        when that already is one (a Linear in ``dtype``), else a copy. Contiguous, so the
        algorithms run the same arithmetic in the same order for either layout."""
        weight = self.module.weight.data
        return _contiguous(weight.t() if self.transposed else weight, dtype)

    def set_matrix(self, W: torch.Tensor) -> None:
        """Make the ``(out, in)`` matrix ``W`` the module's weight, in the module's own layout
        (contiguous, as loading leaves it) and dtype; into the viewed parameter itself when
        ``in_place``."""
        weight = W.t() if self.transposed else W
        if self.in_place:
            with torch.no_grad():
                self.module.weight.copy_(weight)
            return
        self.module.weight.data = _contiguous(weight, self.module.weight.dtype)


class LinearView(torch.nn.Module):
    """A linear layer without parameters of its own: ``weight`` (``(out, in)``) and ``bias``
    are views of a larger parameter, fetched at each call, which subclasses provide (one
    expert's projection in a fused experts tensor, :mod:`llmc_trace.moe.projection`).

    :func:`as_linear` sees one with ``in_place``: a compressed result is copied into the view,
    so it lands in the larger parameter; replacing the view would leave that unchanged.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _contiguous(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` itself when contiguous in ``dtype``, else one contiguous copy in ``dtype``
    (``Tensor.to`` would keep a transposed tensor's strides, or return it unchanged)."""
    if tensor.dtype == dtype and tensor.is_contiguous():
        return tensor
    return torch.empty(tensor.shape, dtype=dtype, device=tensor.device).copy_(tensor)


def as_linear(module: torch.nn.Module) -> LinearLayer | None:
    """``module`` as a :class:`LinearLayer`, or ``None`` when it is not a linear layer."""
    if isinstance(module, torch.nn.Linear):
        return LinearLayer(module, transposed=False)
    if isinstance(module, LinearView):
        return LinearLayer(module, transposed=False, in_place=True)
    # imported here: the tensor-only compress/ package reaches this module through its scheme
    # matching, and should not pay for importing transformers (half a second) at import time
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, Conv1D):
        return LinearLayer(module, transposed=True)
    return None


def is_linear(module: torch.nn.Module) -> bool:
    """Whether ``module`` computes ``x Wᵀ + b`` with a weight :func:`as_linear` can orient."""
    return as_linear(module) is not None
