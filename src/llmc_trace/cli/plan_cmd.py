"""``llmc-trace plan``: the memory plan as a table (or JSON)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource
from rich.table import Table

from llmc_trace.cli.context import CliContext, handle_errors, pass_cli
from llmc_trace.cli.options import NamedPath, declared_option, tracing_options
from llmc_trace.core.declare import declared
from llmc_trace.core.names import MODALITIES
from llmc_trace.spec.settings import CalibrationSettings

if TYPE_CHECKING:
    from llmc_trace.plan import MemoryPlan
    from llmc_trace.plan.estimate import ExpertHessians
    from llmc_trace.tracing.settings import TracingSettings

#: the calibration options a plan is for, as ``compress`` declares them (the same defaults)
_SIZES = ("samples", "seq_len", "batch_size")


def _calibration_sizes(fn):  # type: ignore[no-untyped-def]
    """``--samples``, ``--seq-len`` and ``--batch-size``, derived from their declaration in
    :class:`~llmc_trace.spec.settings.CalibrationSettings`: ``plan`` plans the run
    ``compress`` makes with the same flags."""
    for entry in reversed([e for e in declared(CalibrationSettings) if e.name in _SIZES]):
        fn = declared_option(entry)(fn)
    return fn


@click.command()
@click.option("--model", "-m", required=True, help="Built-in name, hub id, or local folder.")
@_calibration_sizes
@click.option(
    "--device-memory",
    default=None,
    help="Device memory, e.g. 80GiB (default: free "
    "memory of the CUDA device, else available host memory).",
)
@click.option("--host-memory", default=None, help="Host memory, e.g. 512GiB (default: available).")
@click.option("--data-free", is_flag=True, help="Plan for a compressor that needs no data (RTN).")
@click.option(
    "--modality",
    default="text",
    show_default=True,
    type=click.Choice(MODALITIES),
    help="Calibration data of this modality (image: the vision tower's activations count).",
)
@tracing_options
@click.option(
    "--ranks",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Processes sharing the calibration (torchrun --nproc-per-node x nodes): peaks per rank.",
)
@click.option(
    "--recipe",
    "-r",
    default=None,
    type=NamedPath(path_type=Path),
    help="Plan every stage of this recipe (its samples, seq-len, batch size and tracing "
    "settings unless given).",
)
@click.option(
    "--expert-group",
    default=None,
    type=click.IntRange(1),
    help="MoE: plan for calibrating at most this many experts per pass (compress's option).",
)
@click.option(
    "--mappings",
    is_flag=True,
    help="Also list the smooth -> balance pairs AWQ and SmoothQuant scale, proved on the twin.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout only.")
@pass_cli
def plan(
    ctx: CliContext,
    model: str,
    samples: int,
    seq_len: int,
    batch_size: int,
    device_memory: str | None,
    host_memory: str | None,
    data_free: bool,
    modality: str,
    tracing: TracingSettings,
    recipe: Path | None,
    ranks: int,
    expert_group: int | None,
    mappings: bool,
    as_json: bool,
) -> None:
    """Estimate each pipeline's peak device and host memory for MODEL and choose one.

    The plan is for ``compress`` with an output folder (weights streamed from the checkpoint),
    on a GPU when ``--device-memory`` is given or one is present, else on this CPU. With
    ``--recipe``, one plan per stage: each stage is a calibration of its own. With
    ``--ranks N``, the peaks of one rank of N (each calibrates and caches 1/N of the rows).
    """
    import torch

    from llmc_trace.core.names import CALIBRATED_METHODS
    from llmc_trace.core.sizes import parse_bytes
    from llmc_trace.spec.recipe import read_recipe
    from llmc_trace.spec.settings import CalibrationSettings
    from llmc_trace.plan import RunSettings, plan_source

    if recipe is not None and data_free:
        raise click.BadParameter(
            "the recipe's stages say which need data: --data-free applies without a recipe.",
            param_hint="--data-free",
        )
    with handle_errors(ctx), ctx.progress(f"plan {model}"):
        device = parse_bytes(device_memory, "device_memory") if device_memory else None
        host = parse_bytes(host_memory, "host_memory") if host_memory else None
        sizes = dict(zip(_SIZES, (samples, seq_len, batch_size), strict=True))
        stages: list[tuple[str, bool, bool]] = [("", not data_free, True)]
        attention = CalibrationSettings().attn_implementation
        if recipe is not None:
            read = read_recipe(recipe)
            attention = read.calibration.attn_implementation
            given = click.get_current_context().get_parameter_source
            for name in sizes:
                if given(name) != ParameterSource.COMMANDLINE:
                    sizes[name] = getattr(read.calibration, name)
            typed = {name for name in vars(tracing) if given(name) == ParameterSource.COMMANDLINE}
            tracing = replace(read.tracing, **{name: getattr(tracing, name) for name in typed})
            stages = [
                (f"stage {i + 1}: {s.method}", s.method in CALIBRATED_METHODS, s.quantizes)
                for i, s in enumerate(read.stages)
            ]
        if ranks > 1:
            from llmc_trace.core.world import World, check_shareable

            for _, needs_data, _ in stages:
                check_shareable(
                    World(0, ranks), math.ceil(sizes["samples"] / sizes["batch_size"]), needs_data
                )
        runs = [
            RunSettings(
                math.ceil(sizes["samples"] / ranks),  # each rank caches its share of the rows
                sizes["seq_len"],
                sizes["batch_size"],
                needs_data=needs_data,
                kept_bytes_per_weight=1.0 if quantizes else 0.0,
                streamed=True,
                device_is_host=device is None and not torch.cuda.is_available(),
                expert_group=expert_group,
                attention=attention,
            )
            for _, needs_data, quantizes in stages
        ]
        # a stage that calibrates on data traces as compress does: with the fix it settles on
        plans = plan_source(
            model, runs, modality=modality, tracing=tracing, device_memory=device,
            host_memory=host, fix=any(needs_data for _, needs_data, _ in stages),
        )  # fmt: skip
        fix = plans[0].tracing_fix
        if fix:
            tracing = replace(tracing, tracing_ignore=(*tracing.tracing_ignore, *fix))
        pairs = None
        if mappings:
            from llmc_trace.cli.mappings_view import pairs_of

            pairs = pairs_of(ctx.err, model, modality, tracing)
    if as_json:
        from llmc_trace.cli.mappings_view import mappings_document

        last = len(plans) - 1  # only the last stage keeps resume points
        documents = [
            {
                **_plan_document(label, result),
                "resume_bytes": _resume_bytes(result, ranks) if i == last else None,
            }
            for i, ((label, _, _), result) in enumerate(zip(stages, plans, strict=True))
        ]
        document = documents[0] if recipe is None else {"stages": documents}
        document = {**document, "tracing_fix": list(fix)}
        if pairs is not None:
            document = {**document, **mappings_document(pairs)}
        ctx.print_json(document)
        return
    if fix:
        ctx.out.print(
            f"traced with --tracing-ignore {' '.join(fix)}: the fix `attempt --fix` verifies, "
            "which compress applies itself",
            highlight=False,
        )
    for (label, _, _), result in zip(stages, plans, strict=True):
        _print_plan(
            ctx,
            f"memory plan: {model}, {sizes['samples']} samples × {sizes['seq_len']} tokens",
            label,
            result,
            expert_group,
        )
    ctx.out.print(_resume_line(plans[-1], ranks, stages=len(plans)))
    if pairs is not None:
        from llmc_trace.cli.mappings_view import show_mappings

        show_mappings(ctx.out, pairs)


def _plan_document(label: str, result: MemoryPlan) -> dict[str, object]:
    """One plan as ``--json`` prints it."""
    return {
        "stage": label or None,
        "chosen": result.chosen,
        "reason": result.reason,
        "fits": result.fits,
        "device_memory": result.device_memory,
        "host_memory": result.host_memory,
        "estimates": [vars(e) for e in result.estimates],
    }


#: Terminal columns from which each pipeline's description fits in the plan's table.
WIDE_TABLE = 120


def _print_plan(
    ctx: CliContext, title: str, label: str, result: MemoryPlan, expert_group: int | None
) -> None:
    """One plan as a table: each pipeline's peaks, the chosen one highlighted, and why.

    On a terminal narrower than :data:`WIDE_TABLE` the descriptions leave the table for a list
    under it: squeezed into a column they wrapped a word per line, a screen per pipeline."""
    from llmc_trace.core.sizes import human_bytes

    wide = ctx.out.width >= WIDE_TABLE
    # the title on its own line: as the table's title it would wrap to the table's width
    ctx.out.print(f"{title}, {label}" if label else title, highlight=False)
    table = Table()
    table.add_column("pipeline", no_wrap=True)
    for column in ("device peak", "host peak", "of which cache"):
        table.add_column(column, justify="right")
    if wide:
        table.add_column("how")
    for e in result.estimates:
        style = "bold green" if e.pipeline == result.chosen else ""
        sizes = (human_bytes(e.device_bytes), human_bytes(e.host_bytes), human_bytes(e.cache_bytes))
        table.add_row(e.pipeline, *sizes, *([e.detail] if wide else []), style=style)
    ctx.out.print(table)
    if not wide:
        for e in result.estimates:
            ctx.out.print(f"[bold]{e.pipeline}[/]: {e.detail}", highlight=False)
    ctx.out.print(f"chosen: [bold]{result.chosen}[/] — {result.reason}")
    if result.experts is not None:
        ctx.out.print(_experts_line(*result.experts, expert_group))


def _resume_bytes(result: MemoryPlan, ranks: int) -> int | None:
    """Disk the chosen pipeline's resume points take at most; ``None`` where it keeps none."""
    from llmc_trace.core.names import LAYER_SEQUENTIAL, SEQUENTIAL
    from llmc_trace.pipelines.resume import resume_point_bytes

    if result.chosen not in (SEQUENTIAL, LAYER_SEQUENTIAL):
        return None
    return resume_point_bytes(result.estimate(result.chosen).cache_bytes, ranks)


def _resume_line(result: MemoryPlan, ranks: int, *, stages: int) -> str:
    """What a run keeps on disk to resume after an interruption: the last stage's points
    (``result`` is its plan), the one stage whose checkpoint is the run's output; an
    interrupted earlier stage of a recipe restarts."""
    from llmc_trace.core.sizes import human_bytes

    size = _resume_bytes(result, ranks)
    which = "" if stages == 1 else f" of the last stage (stage {stages}; an earlier one restarts)"
    if size is None:
        return (
            f"resume points{which}: none ({result.chosen} keeps none; an interrupted run restarts)"
        )
    return (
        f"resume points{which}: up to {human_bytes(size)} of disk beside --out, besides the "
        "checkpoint (the activations entering the next subgraph, on every rank; "
        "--no-resumable keeps none)"
    )


def _experts_line(layers: int, experts: ExpertHessians, group: int | None) -> str:
    """What a plan's fused experts add to calibration: Hessians per MoE layer, how many are
    alive at once, and their bytes (float32)."""
    from llmc_trace.core.sizes import human_bytes

    line = (
        f"experts: {layers} MoE layers, {experts.count} Hessians each (per expert gate/up "
        f"share one, down has its own); {experts.alive} alive at once, "
        f"{human_bytes(experts.alive_bytes)}"
    )
    if group is None:
        return line + " (--expert-group N calibrates N experts per pass and bounds that)"
    return line + f" instead of {human_bytes(experts.all_bytes)} (--expert-group {group})"
