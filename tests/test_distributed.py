"""Calibration across ranks on ``torch.distributed`` (gloo on CPU): the ranks' Hessians sum to
one process's, the solves are shared out, and a rank that dies ends the run on every rank with
nothing written. That two ranks under torchrun write one process's checkpoint (up to float
order) that transformers loads is proved with their resume, in ``tests/test_resume.py``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from llmc_trace.algorithms.hessian import HessianAccumulator
from llmc_trace.core.world import World, check_shareable, current_world
from llmc_trace.errors import BadInputError

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))
needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 20, 32, generator=generator)
    mask = torch.ones(6, 20, dtype=torch.long)
    mask[1, 12:] = 0  # uneven token counts between the ranks' shares
    mask[4, 3:] = 0
    return x, mask


def _merge_on_rank(rank: int, size: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        world = current_world()
        x, mask = _inputs()
        accumulator = HessianAccumulator(32)
        for row, row_mask in zip(world.shard(list(x)), world.shard(list(mask)), strict=True):
            accumulator.add(row, row_mask)
        accumulator.num_tokens = world.sum_mean(accumulator.H, accumulator.num_tokens)
        torch.save({"H": accumulator.H, "n": accumulator.num_tokens}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_the_ranks_hessians_merge_into_one_process_hessian(tmp_path: Path) -> None:
    mp.spawn(
        _merge_on_rank,
        args=(2, str(tmp_path / "init"), str(tmp_path / "H")),
        nprocs=2,
    )
    x, mask = _inputs()
    alone = HessianAccumulator(32)
    for row, row_mask in zip(x, mask, strict=True):
        alone.add(row, row_mask)
    for rank in (0, 1):
        merged = torch.load(tmp_path / f"H.{rank}")
        assert merged["n"] == alone.num_tokens == 12 + 3 + 4 * 20
        torch.testing.assert_close(merged["H"], alone.H, rtol=1e-5, atol=1e-6)


def test_shares_and_owners_are_disjoint_balanced_and_the_same_everywhere() -> None:
    world = World(1, 3)
    assert world.shard(list(range(8))) == [1, 4, 7]
    assert sorted(sum((World(r, 3).shard(list(range(8))) for r in range(3)), [])) == list(range(8))
    costs = [9.0, 1.0, 5.0, 5.0, 1.0]
    owners = World(0, 2).owners(costs)
    assert owners == World(1, 2).owners(costs) == [0, 0, 1, 1, 0]  # 11 against 10
    assert World().owners(costs) == [0] * 5


def test_ranks_without_data_to_share_are_bad_input() -> None:
    with pytest.raises(BadInputError, match="needs no calibration data"):
        check_shareable(World(0, 2), batches=8, needs_data=False)
    with pytest.raises(BadInputError, match="3 calibration batches cannot be shared by 4"):
        check_shareable(World(0, 4), batches=3, needs_data=True)
    check_shareable(World(), batches=1, needs_data=False)


def torchrun(*args: str) -> subprocess.Popen[str]:
    assert TORCHRUN is not None
    command = [TORCHRUN, "--nproc-per-node", "2", "--no-python", "llmc-trace", "--quiet", *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment
    )


@pytest.mark.slow
@needs_torchrun
def test_a_killed_rank_ends_every_rank_and_leaves_no_output(tmp_path: Path) -> None:
    from tests.test_streamed_compress import bf16_llama

    folder = bf16_llama(tmp_path / "model", layers=8, hidden=512)
    data = tmp_path / "calib.npy"
    np.save(data, np.random.default_rng(0).integers(0, 256, size=(16, 64)))
    out = tmp_path / "out"
    child = torchrun(
        "compress",
        "-m",
        str(folder),
        "-d",
        str(data),
        "--samples",
        "16",
        "--seq-len",
        "64",
        "-o",
        str(out),
        "--no-resumable",  # with resume points, a run that finished a subgraph keeps them
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".out.*")) and time.monotonic() < deadline:
        time.sleep(0.2)  # calibration has started: rank 0 opened its partial checkpoint
    ranks = sorted(
        (p for p in psutil.Process(child.pid).children(recursive=True) if _runs_llmc_trace(p)),
        key=lambda p: p.pid,
    )
    assert len(ranks) == 2, ranks
    victim = next(p for p in ranks if p.environ().get("RANK") == "1")
    victim.send_signal(signal.SIGKILL)
    started = time.monotonic()
    output, _ = child.communicate(timeout=120)
    assert time.monotonic() - started < 60
    assert child.returncode != 0
    assert "rank: 1" in output or "rank 1" in output, output[-2000:]
    assert not out.exists() and not list(tmp_path.glob(".out*")), list(tmp_path.iterdir())


@needs_torchrun
def test_a_rank_that_cannot_read_its_dataset_ends_every_rank_with_its_sentence(
    saved_llama: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each rank runs in a folder of its own, as on a node of its own, and only rank 0's holds
    the dataset the command names: every rank ends at once, rank 0 saying rank 1's sentence
    (no rank waits in a collective for a peer that left, to die with a traceback), exit 2,
    nothing written."""
    folder, data = saved_llama
    for rank in (0, 1):
        (tmp_path / f"node{rank}").mkdir()
    shutil.copyfile(data, tmp_path / "node0" / "calib.npy")
    driver = tmp_path / "on_its_node.py"
    driver.write_text(
        "import os, sys\n"
        f"os.chdir(os.path.join({str(tmp_path)!r}, 'node' + os.environ['RANK']))\n"
        "from llmc_trace.cli.main import main\n"
        "sys.argv[0] = 'llmc-trace'\n"
        "main()\n"
    )
    assert TORCHRUN is not None
    out = tmp_path / "out"
    command = [TORCHRUN, "--nproc-per-node", "2", str(driver), "--quiet", "compress", "-m",
               str(folder), "-d", "calib.npy", "--samples", "8", "--seq-len", "32", "-o", str(out)]  # fmt: skip
    started = time.monotonic()
    child = subprocess.run(
        command, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    output = child.stdout + child.stderr
    assert child.returncode != 0 and time.monotonic() - started < 120
    said = "Invalid value for --dataset: rank 1: data file calib.npy does not exist."
    assert output.count(said) == 1, output[-3000:]
    assert "exitcode  : 2" in output and "[rank0]" not in output and "[rank1]" not in output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@needs_torchrun
def test_each_rank_leaves_the_group_before_it_exits_however_the_block_ends(
    tmp_path: Path,
) -> None:
    """A rank that exits still in a gloo group can abort in its exit handlers ("terminate
    called without an active exception") instead of exiting with its own code, now and then:
    ``joined_from_environment`` leaves the group when its block ends, an exit included."""
    driver = tmp_path / "joins.py"
    driver.write_text(
        "import torch.distributed as dist\n"
        "from llmc_trace.core.world import joined_from_environment\n"
        "try:\n"
        "    with joined_from_environment() as world:\n"
        "        print(f'rank {world.rank} of {world.size} joined', flush=True)\n"
        "        raise SystemExit(3)\n"
        "finally:\n"
        "    print(f'left the group: {not dist.is_initialized()}', flush=True)\n"
    )
    assert TORCHRUN is not None
    child = subprocess.run(
        [TORCHRUN, "--nproc-per-node", "2", str(driver)], capture_output=True, text=True,
        timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    output = child.stdout + child.stderr
    assert "rank 0 of 2 joined" in output and "rank 1 of 2 joined" in output, output[-2000:]
    assert output.count("left the group: True") == 2, output[-2000:]
    assert "exitcode  : 3" in output and "SIGABRT" not in output, output[-2000:]


def _runs_llmc_trace(process: psutil.Process) -> bool:
    """Whether ``process`` is a rank: a short-lived helper torchrun started may already be a
    zombie (or gone) when its command line is read."""
    try:
        return "llmc-trace" in " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return False
