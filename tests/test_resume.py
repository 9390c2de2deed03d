"""A run stopped after subgraph k resumes from there and writes the uninterrupted run's bytes,
running none of the first k subgraphs again; two runs never share an ``--out``; an unfinished
run of another request is refused, or removed with ``--overwrite``.

The runs are stopped by the resume module's test hook (``KILL_AFTER``): killed outright
(SIGKILL) in a subprocess, or, in this process, by an exception nothing catches raised where
the hook would kill, which leaves the staging folder as the kill does (the writer keeps a
folder holding a resume point when a run is interrupted)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from llmc_trace.checkpoint import unpack_from_int32
from llmc_trace.checkpoint.lock import output_lock
from llmc_trace.cli.main import cli
from llmc_trace.oneshot import CompressRequest, LayerCompressor, compress
from llmc_trace.oneshot.resume import KILL_AFTER, read_manifest, staging_folders
from refmodel import VLM_FOLDER
from tests.test_moe import _tiny_qwen3_moe
from tests.test_streamed_compress import bf16_llama, stored

# tiny models are many tiny ops, which a second thread only slows on a busy 2-core machine
pytestmark = pytest.mark.usefixtures("one_thread")
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
#: the command line in a child that sees the CPU as this process does (float32 forwards), so
#: its checkpoint can be compared with one written here, byte for byte
FLOAT32_CPU_CLI = Path(__file__).with_name("float32_cpu.py")
TEXT = dict(samples=4, seq_len=32, batch_size=2, group_size=32)


class Killed(BaseException):
    """Where the test hook would SIGKILL the run (see the module docstring)."""


def digest(folder: Path) -> dict[str, str]:
    """Every safetensors file's sha256, by name."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("*.safetensors"))
    }


def stop_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    monkeypatch.setenv(KILL_AFTER, str(k))

    def kill(pid: int, signum: int) -> None:
        assert pid == os.getpid() and signum == signal.SIGKILL
        raise Killed

    monkeypatch.setattr(os, "kill", kill)


def calibrated_subgraphs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The subgraph indices the compressor is told to calibrate, from now on."""
    seen: list[int] = []
    start = LayerCompressor.on_subgraph_start

    def record(self: LayerCompressor, index: int, modules: object) -> None:
        seen.append(index)
        start(self, index, modules)  # type: ignore[arg-type]

    monkeypatch.setattr(LayerCompressor, "on_subgraph_start", record)
    return seen


def interrupted_then_resumed(
    monkeypatch: pytest.MonkeyPatch, request: CompressRequest, k: int
) -> tuple[object, list[int]]:
    with monkeypatch.context() as patched:
        stop_after(patched, k)
        with pytest.raises(Killed):
            compress(request)
    assert request.out_path is not None and not request.out_path.exists()
    (staging,) = staging_folders(request.out_path)
    assert read_manifest(staging)["finished"] == k  # type: ignore[index]
    with monkeypatch.context() as patched:
        seen = calibrated_subgraphs(patched)
        resumed = compress(request)
    assert not staging_folders(request.out_path)
    assert not (request.out_path.parent / f".{request.out_path.name}.lock").exists()
    return resumed, seen


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 4-layer bfloat16 Llama with tied embeddings (the embedding's first subgraph is
    finished long before the head that shares it is written), and its calibration tokens."""
    folder = bf16_llama(tmp_path_factory.mktemp("text") / "model", layers=4, hidden=64)
    np.save(folder / "calib.npy", np.random.default_rng(0).integers(0, 256, size=(4, 32)))
    return folder, folder / "calib.npy"


def text_request(text: tuple[Path, Path], out: Path, **more: object) -> CompressRequest:
    # shards of 32 kB: a resumed run reopens several, one of them half written
    return CompressRequest(*text, out, max_shard_size=32768, **{**TEXT, **more})


@pytest.fixture(scope="module")
def uninterrupted(
    text: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    out = tmp_path_factory.mktemp("full") / "out"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compress(text_request(text, out))
    finally:
        torch.set_num_threads(threads)
    assert len(digest(out)) > 2
    return digest(out)


@pytest.mark.parametrize("k", [1, 3, 5])  # the embedding's subgraph, a middle one, the last
def test_a_text_run_stopped_after_subgraph_k_resumes_to_the_same_bytes(
    text: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    uninterrupted: dict[str, str],
    k: int,
) -> None:
    resumed, seen = interrupted_then_resumed(monkeypatch, text_request(text, tmp_path / "out"), k)
    assert digest(tmp_path / "out") == uninterrupted
    assert resumed.resume is not None and resumed.resume.skipped == k
    assert min(seen, default=k) >= k  # subgraph i is position i: none of the first k again
    assert len(resumed.layers) == 4 * 7  # the finished subgraphs' results kept for the report


def test_a_sigkilled_run_resumes_by_running_the_same_command(
    text: tuple[Path, Path],
    tmp_path: Path,
    uninterrupted: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    command = arguments(text, tmp_path / "out")
    killed = subprocess.run(
        [sys.executable, str(FLOAT32_CPU_CLI), "--quiet", *command],
        capture_output=True, text=True, env={**ONE_THREAD, KILL_AFTER: "3"}, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    code, output = invoke(*command)
    assert code == 0 and "resumed: subgraphs 1-3 were finished by the interrupted run" in output
    assert "after subgraph 3 (sequential); subgraphs 1-3 are not run again" in caplog.text
    assert digest(tmp_path / "out") == uninterrupted


def test_a_layer_sequential_run_resumes_to_the_same_bytes(
    text: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compress(text_request(text, tmp_path / "full", pipeline="layer_sequential"))
    request = text_request(text, tmp_path / "out", pipeline="layer_sequential")
    resumed, seen = interrupted_then_resumed(monkeypatch, request, 2)
    assert resumed.pipeline == "layer_sequential" and min(seen) == 2  # targets count from 0
    assert digest(tmp_path / "out") == digest(tmp_path / "full")


def test_a_moe_run_resumes_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Qwen3-MoE with 16 experts per layer, each expert's projections compressed and
    stored one by one."""
    folder = _tiny_qwen3_moe(tmp_path / "moe")
    arguments = dict(samples=2, seq_len=8, scheme="W4A16", group_size=32)
    compress(CompressRequest(folder, folder / "calib.npy", tmp_path / "full", **arguments))
    request = CompressRequest(folder, folder / "calib.npy", tmp_path / "out", **arguments)
    resumed, seen = interrupted_then_resumed(monkeypatch, request, 2)
    assert digest(tmp_path / "out") == digest(tmp_path / "full")
    assert resumed.resume.skipped == 2 and min(seen) >= 2  # type: ignore[union-attr]


def test_a_vlm_run_on_images_resumes_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    arguments = dict(samples=2, seq_len=256, modality="image", pipeline="sequential")
    rows = VLM_FOLDER / "calib" / "captions.jsonl"
    compress(CompressRequest(VLM_FOLDER, rows, tmp_path / "full", **arguments))
    request = CompressRequest(VLM_FOLDER, rows, tmp_path / "out", **arguments)
    resumed, _ = interrupted_then_resumed(monkeypatch, request, 2)
    assert digest(tmp_path / "out") == digest(tmp_path / "full")
    assert resumed.resume.skipped == 2  # type: ignore[union-attr]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--quiet", *args], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def arguments(text: tuple[Path, Path], out: Path, *more: str) -> list[str]:
    return ["compress", "-m", str(text[0]), "-d", str(text[1]), "-o", str(out),
            "--samples", "4", "--seq-len", "32", "--batch-size", "2",
            "--max-shard-size", "32768", "--group-size", "32", *more]  # fmt: skip


def test_a_second_run_to_the_same_out_exits_2_naming_the_first(
    text: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with output_lock(out):  # a run writing out, as far as any other can tell
        code, output = invoke(*arguments(text, out))
    assert code == 2 and f"another compress run (pid {os.getpid()}) is writing to" in output
    assert not out.exists() and not staging_folders(out)


def test_an_unfinished_run_of_another_request_is_refused_or_removed(
    text: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        stop_after(patched, 1)
        with pytest.raises(Killed):
            compress(text_request(text, out))
    (staging,) = staging_folders(out)
    code, output = invoke(*arguments(text, out, "--seed", "7"))
    assert code == 2 and "holds an unfinished run that cannot be resumed here" in output
    assert "options, dataset or number of ranks differ" in output and staging.exists()
    code, output = invoke(*arguments(text, out, "--seed", "7", "--no-resumable"))
    assert code == 2 and "this run keeps no resume points" in output
    code, output = invoke(*arguments(text, out, "--seed", "7", "--overwrite"))
    assert code == 0, output
    assert not staging.exists() and digest(out)


def test_resume_with_nothing_to_resume_exits_2(text: tuple[Path, Path], tmp_path: Path) -> None:
    code, output = invoke(*arguments(text, tmp_path / "out", "--resume"))
    assert code == 2 and "--resume found no unfinished run" in output


def test_ctrl_c_after_a_subgraph_keeps_it_and_says_how_to_resume(
    text: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    uninterrupted: dict[str, str],
) -> None:
    out = tmp_path / "out"
    monkeypatch.setenv(KILL_AFTER, "2")

    def interrupt(pid: int, signum: int) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(os, "kill", interrupt)
        code, output = invoke(*arguments(text, out))
    assert code == 130 and "its first 2 subgraphs are kept in" in output, output
    monkeypatch.delenv(KILL_AFTER)
    code, output = invoke(*arguments(text, out))
    assert code == 0 and "resumed: subgraphs 1-2" in output, output
    assert digest(out) == uninterrupted


TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


@pytest.mark.slow
@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
def test_two_ranks_write_the_one_process_checkpoint_and_resume_to_their_own_bytes(
    text: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two ranks under torchrun write one checkpoint (rank 0 alone reports it) that transformers
    loads and that is one process's up to float order: the ranks' Hessians differ from one
    process's by summation order only, which flips a few roundings in the first layer (as
    calibrating the same rows in batches of 2 instead of 1 does in one process). Both ranks
    then SIGKILL themselves after subgraph 3; the same torchrun command resumes, and rank 0's
    checkpoint is the uninterrupted two-rank run's, byte for byte. (One test: each torchrun
    start costs three interpreters' imports, more than the runs.)"""
    assert TORCHRUN is not None

    def torchrun(out: Path, **environment: str) -> subprocess.CompletedProcess[str]:
        command = [TORCHRUN, "--nproc-per-node", "2", str(FLOAT32_CPU_CLI), "--quiet"]
        return subprocess.run(
            [*command, *arguments(text, out, "--batch-size", "1")],
            capture_output=True, text=True, env={**ONE_THREAD, **environment}, timeout=300,
        )  # fmt: skip

    full = torchrun(tmp_path / "full")
    assert full.returncode == 0, full.stderr
    assert (full.stdout + full.stderr).count("wrote ") == 1  # rank 0 alone reports
    compress(text_request(text, tmp_path / "alone", batch_size=1))
    ranks, alone = stored(tmp_path / "full"), stored(tmp_path / "alone")
    assert ranks.keys() == alone.keys()
    first = [k for k in alone if k.startswith("model.layers.0.") and k.endswith("weight_packed")]
    assert first
    for key in first:
        shape = torch.Size(alone[key.replace("packed", "shape")].tolist())
        a, b = (unpack_from_int32(t[key], 4, shape) for t in (alone, ranks))
        assert (a != b).float().mean() < 0.02, key
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "full")
    with torch.no_grad():
        logits = model(torch.as_tensor(np.load(text[1])[:2]).long()).logits
    assert torch.isfinite(logits).all()

    killed = torchrun(tmp_path / "out", **{KILL_AFTER: "3"})
    assert killed.returncode != 0 and not (tmp_path / "out").exists()
    (staging,) = staging_folders(tmp_path / "out")
    assert sorted(p.name for p in (staging / "resume").iterdir()) == [
        "manifest.json",
        "rank0-3.pt",
        "rank1-3.pt",
    ]
    resumed = torchrun(tmp_path / "out")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed: subgraphs 1-3 were finished by the interrupted run" in resumed.stderr
    assert digest(tmp_path / "out") == digest(tmp_path / "full")


def test_plan_bounds_the_resume_points_a_run_keeps(text: tuple[Path, Path], tmp_path: Path) -> None:
    """The plan's figure for the resume points' disk holds the largest they were in a run
    (the per-rank cache, kept twice while a point replaces the one before), within 4x."""
    result = compress(text_request(text, tmp_path / "out"))
    assert result.resume is not None and result.resume.saves == 5
    planned = CliRunner().invoke(
        cli,
        ["--quiet", "plan", "-m", str(text[0]), "--samples", "4", "--seq-len", "32",
         "--batch-size", "2", "--json"],
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    bound = json.loads(planned.stdout)["resume_bytes"]
    assert result.resume.peak_bytes <= bound <= 4 * result.resume.peak_bytes, (
        result.resume.peak_bytes,
        bound,
    )
    code, output = invoke("plan", "-m", str(text[0]), "--samples", "4", "--seq-len", "32")
    assert code == 0 and "resume points: up to" in output and "--no-resumable" in output


def test_a_dead_runs_earlier_stages_are_named_and_removed(
    text: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of several stages killed outright leaves its earlier stages' folders beside the
    output: the next run to that output removes them, saying so."""
    out = tmp_path / "out"
    left = [tmp_path / ".out.stage1.deadbeef", tmp_path / "..out.stage1.deadbeef.0badf00d.partial"]
    for folder in left:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".other.stage1.deadbeef").mkdir()  # another output's: not ours to remove
    code, output = invoke(*arguments(text, out, "--method", "rtn"))
    assert code == 0, output
    assert (
        not any(folder.exists() for folder in left)
        and (tmp_path / ".other.stage1.deadbeef").exists()
    )
    assert caplog.text.count("an earlier stage's model") == 2
