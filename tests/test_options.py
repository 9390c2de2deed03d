"""One declaration per option: a field declared once reaches the command line, the recipe and
the request, and the public names are the documented ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmc_trace.cli.compress_cmd import compress_command
from llmc_trace.spec import settings
from llmc_trace.core.declare import Int, option
from llmc_trace.spec.recipe import read_recipe, render_recipe
from llmc_trace.errors import BadInputError
from llmc_trace.oneshot.driver import compress
from llmc_trace.oneshot.request import CompressRequest, validate


@dataclasses.dataclass(frozen=True)
class CalibrationWithPasses(settings.CalibrationSettings):
    """The calibration section with one more option, declared as every option is."""

    warmup_passes: int = option(3, "Throwaway: passes before calibration.", Int(0))


@pytest.fixture
def declared_option(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(settings.SECTIONS, "calibration", CalibrationWithPasses)
    return "warmup_passes"


def test_an_option_declared_once_is_a_flag_a_recipe_key_and_a_request_field(
    declared_option: str, saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    command = compress_command()
    result = CliRunner().invoke(command, ["--help"], obj=None)
    assert "--warmup-passes" in result.output and "Throwaway: passes" in result.output

    request = CompressRequest(folder, data, samples=4, seq_len=32, warmup_passes=7)
    assert request.calibration.warmup_passes == 7

    text = render_recipe(request.recipe())
    assert "  warmup_passes: 7\n" in text
    (tmp_path / "recipe.yaml").write_text(text)
    read = read_recipe(tmp_path / "recipe.yaml")
    assert read == request.recipe()
    again = CompressRequest.from_recipe(read, folder, warmup_passes=9)
    assert again.calibration.warmup_passes == 9 and again.calibration.samples == 4

    bad = tmp_path / "bad.yaml"
    bad.write_text("calibration:\n  warmup_passes: -1\nstages: [{method: gptq}]\n")
    with pytest.raises(ValueError, match="recipe line 2, `warmup_passes`"):
        read_recipe(bad)


def test_earlier_names_are_read_with_a_warning_naming_the_new_one(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, data = saved_llama
    with pytest.warns(FutureWarning, match="propagate_error is now called propagate"):
        request = CompressRequest(folder, data, samples=4, seq_len=32, propagate_error=False)
    assert request.stages[0].propagate is False
    recipe = tmp_path / "old.yaml"
    recipe.write_text("tracing: {ignore: [Foo.bar]}\nstages: [{method: gptq}]\n")
    with pytest.warns(FutureWarning, match="`ignore` is now `tracing_ignore`"):
        assert read_recipe(recipe).tracing.tracing_ignore == ("Foo.bar",)


def test_an_unknown_option_names_the_closest(saved_llama: tuple[Path, Path]) -> None:
    folder, data = saved_llama
    with pytest.raises(ValueError, match="unknown option 'sample'") as info:
        CompressRequest(folder, data, sample=4)
    assert "samples" in info.value.hint  # type: ignore[attr-defined]


def test_a_request_is_built_without_reading_files_and_validate_reads_them(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Construction checks the options only; ``validate`` (which ``compress`` runs first)
    raises for the model, the output folder and the dataset, each naming its parameter."""
    folder, data = saved_llama
    taken = tmp_path / "taken"
    taken.mkdir()
    cases = {
        "model": CompressRequest(tmp_path / "no-model", data, samples=4, seq_len=32),
        "out": CompressRequest(folder, data, taken, samples=4, seq_len=32),
        "dataset": CompressRequest(folder, tmp_path / "none.npy", samples=4, seq_len=32),
    }  # built: no file was read
    for param, request in cases.items():
        with pytest.raises(BadInputError) as validated:
            validate(request)
        assert validated.value.param == param
        with pytest.raises(BadInputError) as compressed:
            compress(request)
        assert compressed.value.message == validated.value.message
    validate(CompressRequest(folder, data, tmp_path / "free", samples=4, seq_len=32))
    assert not (tmp_path / "free").exists()


def test_group_size_overrides_the_schemes_and_zero_means_per_channel() -> None:
    from llmc_trace.spec.stage import Stage, _scheme_mapping

    assert Stage().scheme.weights.group_size == 128
    grouped = Stage(group_size=32).scheme.weights
    assert (grouped.strategy, grouped.group_size) == ("group", 32)
    channel = Stage(scheme="W8A16", group_size=0).scheme.weights
    assert (channel.strategy, channel.group_size, channel.num_bits) == ("channel", None, 8)
    # the recipe a run writes reads back to the same stage
    again = Stage(scheme=_scheme_mapping(Stage(group_size=32).scheme), group_size=32)
    assert again.scheme == Stage(group_size=32).scheme


def test_a_negative_seed_is_refused_on_the_command_line(tmp_path: Path) -> None:
    """numpy's shuffle refused it with a traceback once the run had started."""
    result = CliRunner().invoke(
        compress_command(), ["-m", "x", "-o", str(tmp_path / "out"), "--seed", "-1"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--seed': -1 is not in the range x>=0." in result.output


def test_max_shard_size_takes_the_sizes_its_help_names(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Click guessed an integer from the default, refusing the '5GB' a recipe takes."""
    folder, data = saved_llama
    common = ["-m", str(folder), "-d", str(data), "--samples", "4", "--seq-len", "32"]
    out = tmp_path / "out"
    result = CliRunner().invoke(
        compress_command(), [*common, "-o", str(out), "--max-shard-size", "100KB"]
    )
    assert result.exit_code == 0, result.output
    assert "  max_shard_size: 100000\n" in (out / "recipe.yaml").read_text()
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    bad = CliRunner().invoke(
        compress_command(), [*common, "-o", str(tmp_path / "bad"), "--max-shard-size", "5XB"]
    )
    assert bad.exit_code == 2
    assert "Invalid value for --max-shard-size: '5XB' is not a memory size." in bad.output


def test_a_text_column_of_numbers_names_the_text_column_option() -> None:
    """It read "holds a int" and named no option ("Invalid value:")."""
    from llmc_trace.data.texts import render_text
    from llmc_trace.errors import DataError

    with pytest.raises(DataError) as info:
        render_text(42, None, where="data.jsonl, row 1 of column 'text'")
    assert info.value.message == (
        "data.jsonl, row 1 of column 'text' holds the int 42, not text or chat messages"
    )
    assert info.value.param == "text_column"
