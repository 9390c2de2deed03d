"""The layers a stage compresses, checked before calibration: something is targeted, every
group fits its layer, every layer the user asked to keep in full precision exists, and keeping
it does not split a layer that servers fuse; options for parts the model lacks are refused."""

from __future__ import annotations

import dataclasses
import difflib
import logging

import torch

from llmc_trace.algorithms.scheme import QuantizationArgs, matches
from llmc_trace.errors import BadInputError
from llmc_trace.calibrate.compressor import LayerCompressor
from llmc_trace.calibrate.hessians import Targets
from llmc_trace.checkpoint.served import served_together
from llmc_trace.models.parts import ModelParts
from llmc_trace.spec.stage import Stage

logger = logging.getLogger(__name__)


def check_targets(
    model: torch.nn.Module,
    compressor: LayerCompressor,
    name: str,
    *,
    group_size_given: bool,
    ignore_given: bool = False,
) -> list[str]:
    """The paths of the targeted layers: something must be targeted, and every group must
    fit its layer, before calibration. A misfit is blamed on --group-size where the user gave
    one, else on the scheme whose groups they are; nothing left to compress, on --ignore
    where the user gave one."""
    targets = compressor.targets(list(model.named_modules()))
    if not targets and ignore_given:
        raise BadInputError(
            f"--ignore keeps every layer of {name} that the scheme targets: nothing is left "
            "to compress.",
            hint="Name fewer layers in --ignore (a 're:' pattern matches every layer whose "
            "path it matches).",
            param="ignore",
        )
    if not targets:
        raise BadInputError(
            f"no layer of {name} is targeted by the scheme.",
            hint="Check the scheme's targets and ignore patterns.",
            param="scheme",
        )
    args = compressor.scheme.weights if compressor.scheme is not None else None
    if args is not None:
        param = "group_size" if group_size_given else "scheme"
        _check_widths(args, targets, compressor.scheme.name, param)
    return [n for n, _ in targets]


def _check_widths(args: QuantizationArgs, targets: Targets, scheme: str, param: str) -> None:
    """Every targeted layer's widths divide into the scheme's groups (or blocks)."""
    if args.strategy == "block":
        assert args.block_structure is not None
        rows, cols = args.block_structure
        misfits = [
            n for n, layer in targets if layer.out_features % rows or layer.in_features % cols
        ]
        what = f"a width that does not divide into {rows} x {cols} blocks"
    elif args.group_size:
        misfits = [n for n, layer in targets if layer.in_features % args.group_size]
        what = f"an input width that is not a multiple of the group size {args.group_size}"
    else:
        return
    if not misfits:
        return
    if args.is_float:
        hint = (
            f"{scheme}'s groups are fixed by its format: use a per-channel scheme (FP8_DYNAMIC), "
            "or keep those layers in full precision (--ignore)."
        )
    else:
        hint = (
            "Pass a group size that divides them (--group-size 32), or 0 for one scale per "
            "output channel, or keep those layers in full precision (--ignore)."
        )
    raise BadInputError(
        f"{len(misfits)} targeted layers (e.g. {misfits[0]}) have {what}.",
        hint=hint,
        param=param,
    )


def check_model_options(
    model: torch.nn.Module, stage: Stage, name: str, routers: list[str], parts: ModelParts
) -> None:
    """Options that act on parts a model may not have are refused where it has none, not
    silently ignored: ``--expert-group`` needs experts (their ``routers``), ``--towers`` a
    vision or audio tower."""
    if stage.expert_group is not None and not routers:
        raise BadInputError(
            f"{name} has no experts for --expert-group to group.",
            hint="Drop --expert-group: it bounds a mixture-of-experts model's Hessians.",
            param="expert_group",
        )
    if stage.towers and not parts.in_towers(path for path, _ in model.named_modules()):
        raise BadInputError(
            f"{name} has no vision or audio tower for --towers to compress.",
            hint="Drop --towers: it compresses a multimodal model's encoders too.",
            param="towers",
        )


def check_ignore(model: torch.nn.Module, stage: Stage) -> None:
    """Every entry of ``stage.ignore`` (keep in full precision) names a module of ``model``:
    a typo would otherwise keep nothing dense and say nothing. An entry spelled as a tracing
    name (``Class.method``) says where those go now."""
    modules = list(model.named_modules())
    for pattern in stage.ignore:
        if any(matches(name, module, (pattern,)) for name, module in modules):
            continue
        candidates = sorted(
            {name for name, _ in modules if name} | {type(m).__name__ for _, m in modules}
        )
        close = difflib.get_close_matches(pattern, candidates, n=3)
        head = pattern.split(".")[0]
        if "." in pattern and head in {type(m).__name__ for _, m in modules}:
            hint = (
                f"{pattern} looks like a tracing name: --ignore keeps layers in full precision; "
                "modules and functions not to trace into go to --tracing-ignore (tracing_ignore)."
            )
        else:
            hint = (
                f"Did you mean {', '.join(close)}?"
                if close
                else "Use a module path, a class name or 're:'."
            )
        raise BadInputError(
            f"--ignore {pattern!r} matches no layer of the model.", hint=hint, param="ignore"
        )


def keep_served_layers_whole(model: torch.nn.Module, stage: Stage) -> Stage:
    """``stage`` with each projection that vLLM fuses with a layer kept in full precision
    kept too (:mod:`llmc_trace.checkpoint.served`), said in one warning: ``--ignore
    ...q_proj`` alone would write a checkpoint vLLM refuses to load."""
    scheme = stage.scheme
    if scheme is None:
        return stage
    modules = list(model.named_modules())
    quantized = [name for name, module in modules if scheme.is_target(name, module)]
    kept = [
        name
        for name, module in modules
        if matches(name, module, scheme.targets) and not scheme.is_target(name, module)
    ]
    added = list(
        dict.fromkeys(
            sibling
            for name in kept
            for sibling in served_together(name, quantized)
            if sibling != name
        )
    )
    if not added:
        return stage
    logger.warning(
        "vLLM serves %s fused with layers kept in full precision, and refuses one fused layer "
        "in two schemes: keeping %s in full precision too",
        added[0] if len(added) == 1 else f"{len(added)} layers ({added[0]}, ...)",
        "it" if len(added) == 1 else "them",
    )
    return dataclasses.replace(stage, ignore=(*stage.ignore, *added))
