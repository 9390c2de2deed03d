"""Refuse a forward pass whose logits are not finite, naming the module where it diverged.

A perplexity computed from NaN logits is NaN, and one computed from infinite logits is
meaningless; either would print as a number. The weights a checkpoint loads with are checked
as they load (:func:`~llmc_trace.models.weights.check_finite`), so logits that are not finite
come from the forward pass itself overflowing. Which module it overflowed in is what a person
needs to know, so the failing batch runs once more with a hook on every module, and the first
module to return a value that is not finite (the innermost, earliest one) is named. Only a
failing batch pays for that second pass.
"""

from __future__ import annotations

from typing import Any

import torch

from llmc_trace.core.finite import non_finite
from llmc_trace.errors import NonFiniteError
from llmc_trace.graph.verify import flatten_output


def check_logits(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], logits: torch.Tensor, batch: int
) -> None:
    """Raise :class:`NonFiniteError` when ``logits`` (``model``'s, for ``inputs``, batch number
    ``batch``) hold NaN or inf, naming the first module whose output does."""
    problem = non_finite(logits)
    if problem is None:
        return
    module = first_non_finite_module(model, inputs)
    found = (
        f"; the first module whose output is not finite is {module} "
        f"({type(model.get_submodule(module)).__name__})"
        if module is not None
        else ""
    )
    dtype = next(model.parameters()).dtype
    remedy = (
        "the checkpoint's values are out of range for this data"
        if dtype == torch.float32
        else "evaluate in float32 (--dtype float32)"
    )
    raise NonFiniteError(
        f"the model's logits on batch {batch} hold {problem}{found}.",
        hint=f"Its weights are finite, so its forward pass overflows in "
        f"{str(dtype).removeprefix('torch.')}: {remedy}.",
        location=module or "logits",
    )


@torch.no_grad()
def first_non_finite_module(model: torch.nn.Module, inputs: dict[str, Any]) -> str | None:
    """The path of the first module of ``model`` (in the order calls return) whose output
    holds NaN or inf when it runs on ``inputs``; ``None`` when none does."""
    found: list[str] = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def seen(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not found and any(non_finite(t) for t in flatten_output(output).values()):
                found.append(name)

        return seen

    handles = [
        module.register_forward_hook(hook(name)) for name, module in model.named_modules() if name
    ]
    try:
        model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None
