"""A run that is stopped, pointed at the wrong place or given a layer that does not exist ends
with one sentence and leaves nothing behind; an existing checkpoint survives it byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from refmodel import FOLDER as REFMODEL

from llmc_trace.cli.main import cli


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def common(saved: tuple[Path, Path]) -> list[str]:
    folder, data = saved
    return ["compress", "-m", str(folder), "-d", str(data), "--samples", "2", "--seq-len", "32"]


@pytest.mark.parametrize(
    ("ignore", "said"),
    [
        ("model.layers.99.mlp", "matches no layer"),
        ("Linaer", "Did you mean Linear"),
        ("re:[", "not a valid regular expression"),
        ("LlamaModel.rotary_fn", "looks like a tracing name"),
    ],
)
def test_an_ignore_that_names_nothing_exits_2_saying_so(
    saved_llama: tuple[Path, Path], tmp_path: Path, ignore: str, said: str
) -> None:
    out = tmp_path / "out"
    code, output = invoke(*common(saved_llama), "-o", str(out), "--ignore", ignore)
    assert code == 2 and said in output and "--ignore" in output, output
    assert not out.exists()


def test_an_ignore_that_keeps_every_layer_is_blamed(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code, output = invoke(*common(saved_llama), "-o", str(out), "--ignore", "re:.*")
    assert code == 2 and "Invalid value for --ignore" in output, output
    assert "nothing is left to compress" in output and not out.exists()


def test_overwrite_replaces_only_a_checkpoint_it_wrote(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own work")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(mine)
    for out, what in ((mine, "a folder"), (a_file, "a file"), (link, "a link")):
        code, output = invoke(*common(saved_llama), "-o", str(out), "--overwrite")
        assert code == 2 and f"is {what} without its recipe.yaml" in output, output
    assert (mine / "notes.txt").read_text() == "my own work" and a_file.read_text() == "x"

    ours = tmp_path / "ours"
    assert invoke(*common(saved_llama), "-o", str(ours))[0] == 0
    code, output = invoke(*common(saved_llama), "-o", str(ours), "--overwrite", "--seed", "3")
    assert code == 0, output


def test_a_stale_staging_folder_is_named_and_removed(
    saved_llama: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = tmp_path / ".out.deadbeef.partial"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    out = tmp_path / "out"
    code, output = invoke(*common(saved_llama), "-o", str(out))
    assert code == 0, output
    assert not stale.exists() and "killed while writing" in caplog.text


@pytest.mark.parametrize("overwrite", [False, True])
def test_sigterm_while_calibrating_removes_the_staging_and_keeps_the_old_checkpoint(
    saved_llama: tuple[Path, Path], tmp_path: Path, overwrite: bool
) -> None:
    folder, data = saved_llama
    out = tmp_path / "out"
    arguments = [*common(saved_llama)[1:], "-o", str(out)]
    before = None
    if overwrite:
        assert invoke("compress", *arguments)[0] == 0
        before = digest(out)
    # without resume points: a run stopped after a subgraph would keep one (tests/test_resume.py)
    slow = [*arguments, "--samples", "8", "--seq-len", "64", "--true-sequential", "--no-resumable"]
    process = subprocess.Popen(
        [sys.executable, "-c", "from llmc_trace.cli.main import main; main()", "--quiet",
         "compress", *slow, *(["--overwrite", "--seed", "5"] if overwrite else [])],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.*.partial")) and time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 143, output
    assert "Interrupted (SIGTERM)" in output and "Traceback" not in output
    assert not list(tmp_path.glob(".out.*"))
    if overwrite:
        assert digest(out) == before
    else:
        assert not out.exists()
    assert os.listdir(tmp_path)  # the fixture's files are still there


#: A command on the real group that writes far more than a pipe holds, through the rich
#: console every command prints with, or through click.echo (the JSON and markdown views).
WRITER = """
import click
from llmc_trace.cli.context import pass_cli
from llmc_trace.cli.main import cli, main

@cli.command()
@click.argument("how")
@pass_cli
def chatter(ctx, how):
    for _ in range(20000):
        ctx.out.print("x" * 80) if how == "rich" else click.echo("x" * 80)

main()
"""


@pytest.mark.parametrize("how", ["rich", "echo"])
def test_a_reader_that_goes_away_ends_the_command_as_the_shell_would(how: str) -> None:
    """``llmc-trace ... | head``: exit code 141 (SIGPIPE's, as the shell reports a command the
    pipe's close ended), not the 1 that here means "the answer is failure"; nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        result = subprocess.run(
            [sys.executable, "-c", WRITER, "--quiet", "chatter", how],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, "")


FAILING = """
import click
from llmc_trace.cli.context import handle_errors, pass_cli
from llmc_trace.cli.main import cli, main

@cli.command()
@click.option("--json", "as_json", is_flag=True)
@pass_cli
def crash(ctx, as_json):
    with handle_errors(ctx):
        raise RuntimeError("expected m1 and m2 to have the same dtype")

@cli.command()
def interrupted():
    raise KeyboardInterrupt  # a Ctrl-C while a command still imports, before its own handling

main()
"""


def test_an_unforeseen_failure_is_one_sentence_and_debug_shows_its_traceback() -> None:
    """Exit code 1, the exception's type and first line, the way to the traceback."""
    quiet = subprocess.run(
        [sys.executable, "-c", FAILING, "crash"], capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    said = " ".join(quiet.stderr.split())
    assert "unexpected RuntimeError: expected m1 and m2 to have the same dtype" in said
    assert "run again with --debug for the traceback" in said
    debug = subprocess.run(
        [sys.executable, "-c", FAILING, "crash", "--debug"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_an_unforeseen_failure_under_json_is_a_json_document_on_stdout() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", FAILING, "crash", "--json"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert ran.returncode == 1 and ran.stderr == ""
    document = json.loads(ran.stdout)
    assert document["exit_code"] == 1 and document["param"] is None
    assert document["error"] == "unexpected RuntimeError: expected m1 and m2 to have the same dtype"


def test_an_interrupt_before_a_command_handles_it_exits_130() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", FAILING, "interrupted"], capture_output=True, text=True, timeout=120
    )
    assert (ran.returncode, ran.stderr.strip()) == (
        130,
        "Interrupted (SIGINT): nothing was written.",
    )


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["compress", "-m", "", "-d", "x.npy", "-o", "out"], "Invalid value for --model: the model is empty"),
        (["compress", "-m", str(REFMODEL), "-d", "", "-o", "out"], "Invalid value for --dataset: the calibration source is empty"),
        (["coverage", "--all", "-m", "nosuchtype"], "nosuchtype is not a generative model type"),
    ],
)  # fmt: skip
def test_an_empty_or_unknown_name_is_blamed_on_its_option(
    arguments: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = invoke(*arguments)
    assert code == 2 and said in output, output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["compress", "-m", str(REFMODEL), "-o", "out", "--resume", "--overwrite"], "give one of them"),
        (["plan", "-m", str(REFMODEL), "--data-free", "-r", "recipe.yaml"], "--data-free applies without a recipe"),
        (["coverage", "--markdown", "--json"], "give one"),
        (["compress", "-m", str(REFMODEL), "-d", str(REFMODEL / "calib.npy"), "-o", "out", "--text-column", "body"], "holds token ids, which have no columns for --text-column"),
        (["compress", "-m", str(REFMODEL), "-d", str(REFMODEL / "calib.npy"), "-o", "out", "--samples", "4", "--seq-len", "32", "--expert-group", "3"], "has no experts for --expert-group"),
        (["compress", "-m", str(REFMODEL), "-d", str(REFMODEL / "calib.npy"), "-o", "out", "--samples", "4", "--seq-len", "32", "--towers"], "has no vision or audio tower"),
        (["compress", "-m", str(REFMODEL), "-d", str(REFMODEL / "calib.npy"), "-o", "dangling"], "dangling is a link to nowhere/at-all, which does not exist"),
    ],
)  # fmt: skip
def test_flags_and_paths_that_cannot_work_exit_2_naming_them(
    arguments: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.yaml").write_text("stages: [{method: gptq}]\n")
    (tmp_path / "dangling").symlink_to("nowhere/at-all")
    code, output = invoke(*arguments)
    assert code == 2 and said in output, output
    assert not (tmp_path / "out").exists()


def test_an_option_the_recipe_set_is_blamed_on_the_recipe(tmp_path: Path) -> None:
    """The recipe's group size fits no layer: --recipe is where it is corrected, and the same
    value typed as --group-size is blamed on that flag."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"calibration: {{dataset: {REFMODEL / 'calib.npy'}, samples: 4, seq_len: 32}}\n"
        "stages: [{method: gptq, scheme: W4A16, group_size: 100}]\n"
    )
    out = tmp_path / "out"
    code, output = invoke("compress", "-m", str(REFMODEL), "-r", str(recipe), "-o", str(out))
    assert code == 2 and "Invalid value for --recipe" in output and "group size 100" in output
    typed = ("compress", "-m", str(REFMODEL), "-r", str(recipe), "-o", str(out))
    code, output = invoke(*typed, "--group-size", "100")
    assert code == 2 and "Invalid value for --group-size" in output
    assert not out.exists()
