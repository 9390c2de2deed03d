"""``llmc-trace compress`` and ``llmc-trace evaluate``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from llmc_trace.cli.context import CliContext, handle_errors, interruptible, pass_cli
from llmc_trace.cli.options import NamedPath, SHOW_DEFAULT, declared_option, split_list
from llmc_trace.core.declare import Declared, declared
from llmc_trace.core.names import AUTO, DTYPES, MODALITIES
from llmc_trace.errors import LlmcTraceError
from llmc_trace.spec import settings

if TYPE_CHECKING:
    import torch

    from llmc_trace.oneshot.result import CompressionResult
    from llmc_trace.report.schema import CompressionReport


def compress_command() -> click.Command:
    """``llmc-trace compress``, its options derived from the run's declarations
    (:data:`~llmc_trace.spec.settings.SECTIONS`): built when the group is, so an option
    declared there is a flag here with its help and kind."""
    command: Callable[..., None] = pass_cli(_compress)  # a new function: options attach to it
    for entry in reversed(_declared()):
        if entry.flag is not None:
            command = declared_option(entry)(command)
    for decorator in reversed(_RUN_OPTIONS):
        command = decorator(command)
    return click.command(name="compress")(command)


_RUN_OPTIONS = [
    click.option(
        "--model", "-m", required=True, help="Checkpoint folder (config.json + *.safetensors)."
    ),
    click.option(
        "--recipe",
        "-r",
        default=None,
        type=NamedPath(path_type=Path),
        help="Recipe YAML (e.g. a checkpoint's recipe.yaml); flags given here override its values.",
    ),
    click.option(
        "--out",
        "-o",
        "out_dir",
        required=True,
        type=NamedPath(path_type=Path),
        help="Output folder (written under a temporary name, renamed when complete).",
    ),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Replace --out if it exists (once complete); remove an interrupted run's "
        "unfinished output instead of resuming it.",
    ),
    click.option(
        "--resume",
        is_flag=True,
        help="Continue the interrupted run writing --out after its last finished subgraph "
        "(the same command does so by itself; with --resume, finding none is an error).",
    ),
    click.option(
        "--resumable/--no-resumable",
        default=True,
        **SHOW_DEFAULT,
        help="Keep a resume point after each subgraph (the activations entering the next, on "
        "disk beside --out: `plan` shows their size).",
    ),
]


def _compress(
    ctx: CliContext,
    model: str,
    recipe: Path | None,
    out_dir: Path,
    overwrite: bool,
    resume: bool,
    resumable: bool,
    **options: Any,
) -> None:
    """Calibrate MODEL on DATASET and write a compressed-tensors checkpoint to OUT.

    With --recipe the run is the recipe's (its stages, calibration and tracing settings); the
    flags given on the command line override its values. Under ``torchrun --nproc-per-node N
    --no-python llmc-trace compress ...`` the N ranks share the calibration batches and the
    solves; rank 0 writes the checkpoint.

    A run interrupted after finishing a subgraph (SIGINT, SIGTERM, SIGKILL, a lost machine)
    leaves its finished subgraphs beside OUT; the same command continues from there and
    writes the checkpoint an uninterrupted run would have.

    Exit code 0: written; 1: compression failed (nothing is written); 2: bad input, reported
    before any heavy work (another run writing OUT among it).
    """
    if resume and overwrite:
        raise click.BadParameter(
            "--resume continues an interrupted run, and --overwrite removes it to start "
            "afresh: give one of them.",
            param_hint="--resume",
        )
    from llmc_trace.core.world import joined_from_environment
    from llmc_trace.oneshot.request import CompressRequest, validate
    from llmc_trace.oneshot.driver import compress as run_compress

    given = _given_on_command_line(click.get_current_context(), options)

    def request() -> CompressRequest:
        if recipe is None:
            built = CompressRequest(model, out_dir=out_dir, overwrite=overwrite, **given)
        else:
            built = CompressRequest.from_recipe(
                recipe, model, out_dir, overwrite=overwrite, **given
            )
        validate(built)  # the model, OUT and the dataset, before the run starts
        return built

    # under torchrun: this rank of the group, left before the process exits however it ends
    with (
        joined_from_environment() as world,
        interruptible(ctx, "compress", kept=lambda: _kept(out_dir)),
        handle_errors(ctx),
        _recipe_blamed(recipe, given),
        ctx.progress("compress") as progress,
    ):
        # every rank checks its request (its dataset among it); one that fails ends them all
        result = run_compress(
            world.agree(request), progress=progress, resume=resume, resumable=resumable
        )
    if not world.is_main:
        return
    if result.resume is not None and result.resume.skipped:
        ctx.err.print(
            f"resumed: subgraphs 1-{result.resume.skipped} were finished by the interrupted "
            "run and not run again"
        )
    stages = " then ".join(
        f"{s.stage.method} ({s.pipeline}, {len(s.layers)} layers)" for s in result.stages
    )
    for note in result.data_notes:
        ctx.err.print(f"[dim]data: {note}[/]")
    ctx.out.print(f"wrote {result.out_dir}: {stages}, {result.elapsed_s:.1f} s")
    for stage in result.stages:
        ctx.out.print(f"[dim]plan ({stage.stage.method}): {stage.plan.reason}[/]")
    for fallback in result.fallbacks:
        ctx.err.print(f"[yellow]fell back:[/] {fallback}")
    _print_coverage(ctx, result)
    for part in _compression_summary(result.report):
        ctx.out.print(part)
    ctx.out.print(
        f"[dim]every layer, and the --ignore that keeps it dense: {out_dir}/report.html[/]"
    )


def _kept(out_dir: Path) -> str | None:
    """The resume point an interrupted run left for ``out_dir``, in words; ``None`` if none."""
    from llmc_trace.oneshot.resume import read_manifest, staging_folders

    for staging in staging_folders(out_dir):
        manifest = read_manifest(staging)
        if manifest is not None and manifest.get("finished"):
            return (
                f"its first {manifest['finished']} subgraphs are kept in {staging}; run the "
                "same command again to resume"
            )
    return None


def _declared() -> list[Declared]:
    """Every declared option, section by section (a recipe's order)."""
    return [entry for section in settings.SECTIONS.values() for entry in declared(section)]


#: Options a recipe never sets: an error about one of them is the command line's.
_NOT_IN_RECIPES = frozenset({"model", "out", "overwrite", "resume", "resumable"})


@contextlib.contextmanager
def _recipe_blamed(recipe: Path | None, given: dict[str, Any]) -> Iterator[None]:
    """An error about an option the recipe set, not the command line, names --recipe: that is
    where the user corrects it (a recipe's group size no layer width takes, its dataset)."""
    try:
        yield
    except LlmcTraceError as err:
        param = err.param
        if recipe is not None and param and param not in given and param not in _NOT_IN_RECIPES:
            err.param = "recipe"
        raise


def _given_on_command_line(context: click.Context, options: dict[str, Any]) -> dict[str, Any]:
    """The options whose flags were typed (not defaults), by name: they override a recipe and
    the declared defaults. Lists typed as ``a,b`` or repeated are split."""
    given = {}
    for name, value in options.items():
        if context.get_parameter_source(name) != click.core.ParameterSource.COMMANDLINE:
            continue
        given[name] = tuple(split_list(value) or ()) if isinstance(value, tuple) else value
    return given


def _print_coverage(ctx: CliContext, result: CompressionResult) -> None:
    """Which weights the run compressed, by kind, and every layer compressed otherwise than
    its method (experts too few tokens reached); plainly when most were left untouched."""
    from llmc_trace.models.parts import TOWER_PARTS
    from llmc_trace.oneshot.weight_coverage import untouched_share

    coverage = result.stages[-1].coverage
    kinds, towers = (
        [
            f"{row.kind} {100 * row.compressed / row.total:.0f}% of {row.total / 1e6:.2f}M"
            for row in coverage
            if (row.kind in TOWER_PARTS) == apart
        ]
        for apart in (False, True)
    )
    if towers:
        kept = any(row.kind in TOWER_PARTS and not row.compressed for row in coverage)
        note = " (kept in full precision; --towers compresses them)" if kept else ""
        ctx.out.print(f"[dim]compressed weights: language model: {', '.join(kinds)}[/]")
        ctx.out.print(f"[dim]  {', '.join(towers)}{note}[/]")
    else:
        ctx.out.print(f"[dim]compressed weights: {', '.join(kinds)}[/]")
    share = untouched_share(coverage)
    if share > 0.5:
        ctx.err.print(
            f"[yellow]warning:[/] {100 * share:.0f}% of the model's linear-like weights were "
            "not compressed (see the kinds above); check the scheme's targets and ignore."
        )
    experts = next((row for row in coverage if row.kind == "experts"), None)
    if experts is not None and not experts.compressed:
        ctx.err.print(
            f"[yellow]warning:[/] none of the {experts.total / 1e6:.2f}M expert weights were "
            "compressed: experts are compressed as Linear layers or as transformers' fused "
            "experts, and this release of transformers stores them otherwise, or the ignore "
            "list names them; upgrade transformers if --ignore does not."
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


def _compression_summary(report: CompressionReport, worst: int = 5) -> list[Table | str]:
    """Per stage, one line of totals and a table of the layers that kept the most of their
    baseline's loss (relative loss, losses, tokens); report.html has every layer."""
    parts: list[Table | str] = []
    for summary in report.summary():
        rows = report.worst(worst, summary["stage"])
        if not rows:
            continue
        baseline = rows[0].baseline
        parts.append(
            f"{summary['method']}: {summary['layers']} layers, loss {summary['relative_loss']:.3f}x "
            f"{baseline}'s on the same Hessians (median layer "
            f"{summary['median_relative_loss']:.3f}x)"
        )
        table = Table(title=f"highest relative loss (loss / {baseline}'s)", title_justify="left")
        table.add_column("layer", overflow="fold")  # a name cut short names nothing
        for column in ("relative", "loss", f"{baseline} loss", "tokens"):
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(
                row.name,
                f"{row.relative_loss:.3f}",
                f"{row.loss:.4g}",
                f"{row.baseline_loss:.4g}",
                str(row.num_tokens),
            )
        parts.append(table)
    return parts


#: The calibration options ``evaluate`` shares with ``compress``: how rows are read.
_COLUMN_OPTIONS = ("text_column", "image_column", "audio_column", "text_lists")


def _column_options(command: Callable[..., None]) -> Callable[..., None]:
    """``evaluate``'s column options, from the calibration declarations ``compress`` reads
    (one definition of each: its flag, help and kind)."""
    entries = [e for e in declared(settings.CalibrationSettings) if e.name in _COLUMN_OPTIONS]
    for entry in reversed(entries):
        command = declared_option(entry)(command)
    return command


@click.command()
@click.option("--model", "-m", required=True, help="Checkpoint folder (original or compressed).")
@click.option(
    "--data",
    "--dataset",
    "-d",
    "data",
    required=True,
    help="Token array (.npy), text file, or rows of images/video/audio with text, as for "
    "--dataset of compress.",
)
@click.option(
    "--modality",
    default=AUTO,
    **SHOW_DEFAULT,
    type=click.Choice((AUTO, *MODALITIES)),
    help="text, image, video or audio (auto: from the data's columns); media rows are scored "
    "on their text given the media, through the model folder's processor.",
)
@_column_options
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(1),
    help="Rows to score (default: all of a .npy, every media row that fits, each text of a "
    "list with --text-lists each; all the windows of a text, up to 128).",
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
    modality: str,
    text_column: str | None,
    image_column: str | None,
    audio_column: str | None,
    text_lists: str,
    samples: int | None,
    seq_len: int,
    batch_size: int,
    dtype: str,
    as_json: bool,
) -> None:
    """Perplexity of MODEL on DATA (each row scored independently; media placeholder tokens
    and padding never scored)."""
    from llmc_trace.evaluate import evaluate_model

    with handle_errors(ctx), ctx.progress("evaluate") as progress:
        columns = settings.CalibrationSettings(
            text_column=text_column, image_column=image_column, audio_column=audio_column,
            text_lists=text_lists,
        ).columns()  # fmt: skip
        result = evaluate_model(
            model,
            data,
            columns=columns,
            samples=samples,
            seq_len=seq_len,
            batch_size=batch_size,
            modality=None if modality == AUTO else modality,
            dtype=_dtype(dtype),
            progress=progress,
        )
    if as_json:
        ctx.print_json(
            {
                "model": model,
                "data": data,
                "dtype": dtype,
                "modality": result.modality,
                "perplexity": result.perplexity,
                "num_tokens": result.num_tokens,
                "notes": list(result.notes),
                "elapsed_s": result.elapsed_s,
            }
        )
        return
    for note in result.notes:
        ctx.err.print(f"[dim]data: {note}[/]")
    table = Table(show_header=False)
    table.add_row("perplexity", f"{result.perplexity:.3f}")
    table.add_row("tokens scored", str(result.num_tokens))
    table.add_row("seconds", f"{result.elapsed_s:.1f}")
    ctx.out.print(table)


def _dtype(name: str) -> torch.dtype | None:
    """The torch dtype named on the command line; ``None`` for auto."""
    import torch

    return None if name == AUTO else getattr(torch, name)
