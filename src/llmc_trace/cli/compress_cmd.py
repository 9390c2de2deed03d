"""``llmc-trace compress`` and ``llmc-trace evaluate``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from llmc_trace.cli.context import CliContext, handle_errors, pass_cli
from llmc_trace.cli.options import SHOW_DEFAULT, split_list

from llmc_trace.core.names import (
    ALL_TOKENS,
    AUTO,
    DTYPES,
    EXPERT_TOKENS,
    GPTQ,
    METHODS,
    PIPELINES,
    SPARSEGPT,
)

if TYPE_CHECKING:
    import torch

    from llmc_trace.oneshot import CompressRequest
    from llmc_trace.oneshot.run import CompressionResult


@click.command()
@click.option(
    "--model", "-m", required=True, help="Checkpoint folder (config.json + *.safetensors)."
)
@click.option(
    "--dataset",
    "-d",
    default=None,
    help="Calibration data: .npy token array, .jsonl/.json/.parquet/.txt file, or hub id "
    "(or the recipe's).",
)
@click.option(
    "--recipe",
    "-r",
    default=None,
    type=click.Path(path_type=Path),
    help="Recipe YAML (e.g. a checkpoint's recipe.yaml); flags given here override its values.",
)
@click.option(
    "--out",
    "-o",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Output folder (written under a temporary name, renamed when complete).",
)
@click.option(
    "--scheme",
    default="W4A16",
    **SHOW_DEFAULT,
    help="W4A16, W4A16_ASYM, W8A16 or W8A8; 'none' to prune only.",
)
@click.option(
    "--method",
    default=None,
    type=click.Choice(METHODS),
    help="Default: gptq, or sparsegpt when --sparsity is given.",
)
@click.option("--sparsity", default=None, help="Fraction such as 0.5, or N:M such as 2:4.")
@click.option(
    "--samples", default=128, **SHOW_DEFAULT, type=click.IntRange(1), help="Calibration samples."
)
@click.option(
    "--seq-len", default=512, **SHOW_DEFAULT, type=click.IntRange(2), help="Tokens per sample."
)
@click.option(
    "--batch-size",
    default=1,
    **SHOW_DEFAULT,
    type=click.IntRange(1),
    help="Samples per forward pass.",
)
@click.option(
    "--pipeline",
    default="auto",
    **SHOW_DEFAULT,
    type=click.Choice([AUTO, *PIPELINES]),
    help="auto: the memory plan's choice.",
)
@click.option(
    "--no-propagate", is_flag=True, help="Do not rerun compressed subgraphs (no error propagation)."
)
@click.option(
    "--true-sequential",
    is_flag=True,
    help="Calibrate each layer's projections in dependency stages (sequential pipeline).",
)
@click.option(
    "--refine-passes",
    default=0,
    **SHOW_DEFAULT,
    type=click.IntRange(0),
    help="GPTQ: refine by coordinate descent, at most this many passes (e.g. 20).",
)
@click.option(
    "--expert-tokens",
    default=ALL_TOKENS,
    **SHOW_DEFAULT,
    type=click.Choice(EXPERT_TOKENS),
    help="MoE: build each expert's Hessian from every token, or only those routed to it.",
)
@click.option(
    "--min-expert-tokens",
    default=8,
    **SHOW_DEFAULT,
    type=click.IntRange(1),
    help="MoE: an expert with fewer tokens is rounded to nearest (and named).",
)
@click.option(
    "--expert-group",
    default=None,
    type=click.IntRange(1),
    help="MoE: calibrate at most this many experts per pass (bounds the Hessians alive).",
)
@click.option("--seed", default=0, **SHOW_DEFAULT, type=int, help="Shuffling seed.")
@click.option(
    "--attn-implementation",
    default="sdpa",
    **SHOW_DEFAULT,
    type=click.Choice(["sdpa", "eager"]),
    help="Attention kernel for calibration (eager where the model has no sdpa).",
)
@click.option(
    "--dtype",
    default=AUTO,
    **SHOW_DEFAULT,
    type=click.Choice(DTYPES),
    help="The checkpoint's dtype (auto: the one config.json declares).",
)
@click.option(
    "--max-shard-size",
    default="5GB",
    **SHOW_DEFAULT,
    help="Bytes of tensors per output shard (e.g. 5GB, 500MiB).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists (once complete).")
@click.option(
    "--ignore",
    "-i",
    "keep_dense",
    multiple=True,
    help="Layers to keep in full precision: module paths (as report.html lists them), class "
    "names or 're:' patterns, added to the scheme's ignore list (comma-separated or repeated).",
)
@pass_cli
def compress(
    ctx: CliContext,
    model: str,
    dataset: str | None,
    recipe: Path | None,
    out_dir: Path,
    scheme: str,
    method: str | None,
    sparsity: str | None,
    samples: int,
    seq_len: int,
    batch_size: int,
    pipeline: str,
    no_propagate: bool,
    true_sequential: bool,
    refine_passes: int,
    expert_tokens: str,
    min_expert_tokens: int,
    expert_group: int | None,
    seed: int,
    attn_implementation: str,
    dtype: str,
    max_shard_size: str,
    overwrite: bool,
    keep_dense: tuple[str, ...],
) -> None:
    """Calibrate MODEL on DATASET and write a compressed-tensors checkpoint to OUT.

    With --recipe the run is the recipe's (its stages, calibration and tracing settings); the
    flags given on the command line override its values. Under ``torchrun --nproc-per-node N
    --no-python llmc-trace compress ...`` the N ranks share the calibration batches and the
    solves; rank 0 writes the checkpoint.

    Exit code 0: written; 1: compression failed (nothing is written); 2: bad input, reported
    before any heavy work.
    """
    from llmc_trace.cli.display import compression_summary
    from llmc_trace.core.sizes import parse_bytes
    from llmc_trace.core.world import join_from_environment
    from llmc_trace.errors import BadInputError
    from llmc_trace.oneshot import CompressRequest
    from llmc_trace.oneshot import compress as run_compress

    values = {
        "dataset": dataset,
        "scheme": None if scheme.lower() == "none" else scheme,
        "method": method or (SPARSEGPT if sparsity else GPTQ),
        "sparsity": sparsity,
        "samples": samples,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "seed": seed,
        "pipeline": pipeline,
        "propagate_error": not no_propagate,
        "true_sequential": true_sequential,
        "refine_passes": refine_passes,
        "expert_tokens": expert_tokens,
        "min_expert_tokens": min_expert_tokens,
        "expert_group": expert_group,
        "overwrite": overwrite,
        "attn_implementation": attn_implementation,
        "dtype": _dtype(dtype),
        "max_shard_size": max_shard_size,
    }
    world = join_from_environment()  # under torchrun: this rank of the group
    with handle_errors(ctx), ctx.progress("compress") as progress:
        values["max_shard_size"] = parse_bytes(max_shard_size, "max_shard_size")
        if recipe is None:
            if dataset is None:
                raise BadInputError(
                    "no calibration data given.",
                    hint="Pass --dataset (a .npy token array, a text file or a hub id), or a "
                    "--recipe that names one.",
                    param="dataset",
                )
            request = CompressRequest(model, out_dir=out_dir, **values)  # type: ignore[arg-type]
        else:
            given = _given_on_command_line(click.get_current_context())
            if "sparsity" in given and method is None:
                given.add("method")
            overrides = {name: value for name, value in values.items() if name in given}
            request = CompressRequest.from_recipe(recipe, model, out_dir, **overrides)
        if keep_dense:
            request = _ignoring(request, split_list(keep_dense) or [])
        result = run_compress(request, progress=progress)
    if not world.is_main:
        return
    stages = " then ".join(
        f"{s.stage.method} ({s.pipeline}, {len(s.layers)} layers)" for s in result.stages
    )
    ctx.out.print(f"wrote {result.out_dir}: {stages}, {result.elapsed_s:.1f} s")
    for stage in result.stages:
        ctx.out.print(f"[dim]plan ({stage.stage.method}): {stage.plan.reason}[/]")
    for fallback in result.fallbacks:
        ctx.err.print(f"[yellow]fell back:[/] {fallback}")
    _print_coverage(ctx, result)
    for part in compression_summary(result.report):
        ctx.out.print(part)
    ctx.out.print(
        f"[dim]every layer, and the --ignore that keeps it dense: {out_dir}/report.html[/]"
    )


def _print_coverage(ctx: CliContext, result: CompressionResult) -> None:
    """Which weights the run compressed, by kind, and every layer compressed otherwise than
    its method (experts too few tokens reached); plainly when most were left untouched."""
    from llmc_trace.oneshot.coverage import untouched_share

    coverage = result.stages[-1].coverage
    parts = [
        f"{row.kind} {100 * row.compressed / row.total:.0f}% of {row.total / 1e6:.2f}M"
        for row in coverage
    ]
    ctx.out.print(f"[dim]compressed weights: {', '.join(parts)}[/]")
    share = untouched_share(coverage)
    if share > 0.5:
        ctx.err.print(
            f"[yellow]warning:[/] {100 * share:.0f}% of the model's linear-like weights were "
            "not compressed (see the kinds above); check the scheme's targets and ignore."
        )
    for stage in result.stages:
        others = [layer for layer in stage.layers if layer.fallback]
        if others:
            shown = ", ".join(f"{layer.name} ({layer.fallback})" for layer in others[:3])
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            ctx.err.print(
                f"[yellow]{len(others)} layers compressed otherwise ({stage.stage.method}):[/] "
                f"{shown}{more}; all listed in recipe.yaml"
            )


def _ignoring(request: CompressRequest, names: list[str]) -> CompressRequest:
    """``request`` with ``names`` added to the ignore list of every stage's scheme, so those
    layers stay in full precision (and so the recipe written beside the checkpoint says)."""
    import dataclasses

    from llmc_trace.errors import BadInputError
    from llmc_trace.oneshot import CompressRequest
    from llmc_trace.oneshot.request import STAGE_FIELDS

    stages = request.stages or ()
    if all(stage.scheme is None for stage in stages):
        raise BadInputError(
            "--ignore keeps layers out of quantization, and this run only prunes.",
            hint="Leave out --ignore, or give the run a --scheme.",
            param="ignore",
        )
    changed = tuple(
        dataclasses.replace(
            stage, scheme=dataclasses.replace(stage.scheme, ignore=(*stage.scheme.ignore, *names))
        )
        if stage.scheme is not None
        else stage
        for stage in stages
    )
    kept = {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(request)
        if f.init and f.name not in (*STAGE_FIELDS, "stages")
    }
    return CompressRequest(**kept, stages=changed)


#: command-line parameter -> the request field it sets
_FIELD_OF = {"no_propagate": "propagate_error"}


def _given_on_command_line(context: click.Context) -> set[str]:
    """The request fields whose flags were typed (not defaults): they override a recipe."""
    return {
        _FIELD_OF.get(name, name)
        for name in context.params
        if context.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
    }


@click.command()
@click.option("--model", "-m", required=True, help="Checkpoint folder (original or compressed).")
@click.option(
    "--data",
    "--dataset",
    "data",
    required=True,
    help="Token array (.npy) or text file, as for --dataset of compress.",
)
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(1),
    help="Rows to score (default: all of a .npy; 128 windows of text).",
)
@click.option(
    "--seq-len",
    default=512,
    **SHOW_DEFAULT,
    type=click.IntRange(2),
    help="Tokens per row for text files.",
)
@click.option(
    "--batch-size", default=8, **SHOW_DEFAULT, type=click.IntRange(1), help="Rows per forward pass."
)
@click.option(
    "--dtype",
    default=AUTO,
    **SHOW_DEFAULT,
    type=click.Choice(DTYPES),
    help="Evaluate in this dtype (auto: the one config.json declares).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout only.")
@pass_cli
def evaluate(
    ctx: CliContext,
    model: str,
    data: str,
    samples: int | None,
    seq_len: int,
    batch_size: int,
    dtype: str,
    as_json: bool,
) -> None:
    """Perplexity of MODEL on DATA (each row scored independently)."""
    from llmc_trace.evaluate import evaluate_model

    with handle_errors(ctx), ctx.progress("evaluate") as progress:
        result = evaluate_model(
            model,
            data,
            samples=samples,
            seq_len=seq_len,
            batch_size=batch_size,
            dtype=_dtype(dtype),
            progress=progress,
        )
    if as_json:
        ctx.print_json(
            {
                "model": model,
                "data": data,
                "dtype": dtype,
                "perplexity": result.perplexity,
                "num_tokens": result.num_tokens,
                "elapsed_s": result.elapsed_s,
            }
        )
        return
    table = Table(show_header=False)
    table.add_row("perplexity", f"{result.perplexity:.3f}")
    table.add_row("tokens scored", str(result.num_tokens))
    table.add_row("seconds", f"{result.elapsed_s:.1f}")
    ctx.out.print(table)


def _dtype(name: str) -> torch.dtype | None:
    """The torch dtype named on the command line; ``None`` for auto."""
    import torch

    return None if name == AUTO else getattr(torch, name)
