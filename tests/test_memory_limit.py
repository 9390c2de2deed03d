"""A limit on the process's memory (a cgroup's, ``ulimit -v``) counts in the memory plan, and a
run whose plan cannot fit it stops before it reads a weight, with the plan's figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmc_trace.core import memory_limit as limits
from llmc_trace.core.memory_limit import MemoryLimit, memory_limit
from llmc_trace.errors import BadInputError
from llmc_trace.models.weight_store import WeightStore
from llmc_trace.oneshot import CompressRequest, compress, stage_run
from tests.test_streamed_compress import bf16_llama


def cgroup(root: Path, **files: str) -> Path:
    for name, text in files.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.max": "1073741824", "memory.current": "268435456"}, (805306368, "memory.max")),
        (
            {
                "memory__memory.limit_in_bytes": "536870912",
                "memory__memory.usage_in_bytes": "536870913",
            },
            (0, "memory.limit_in_bytes"),
        ),
        ({"memory.max": "max", "memory.current": "1"}, None),
        (
            {
                "memory__memory.limit_in_bytes": "9223372036854771712",
                "memory__memory.usage_in_bytes": "1",
            },
            None,
        ),  # fmt: skip
        ({}, None),
    ],
    ids=["v2", "v1-over", "v2-none", "v1-none", "no-cgroup"],
)
def test_a_cgroup_limit_leaves_its_limit_less_its_usage(
    tmp_path: Path,
    files: dict[str, str],
    expected: tuple[int, str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the cgroup alone: a ``ulimit -v`` on the machine running the tests would leave less
    monkeypatch.setattr(limits, "_address_space", lambda: None)
    found = memory_limit(cgroup(tmp_path, **files))
    if expected is None:
        assert found is None
    else:
        assert found is not None and (found.available_bytes, found.source) == (
            expected[0],
            f"cgroup {expected[1]}",
        )


def test_ulimit_v_is_read_as_the_limit_less_what_the_process_maps() -> None:
    """A child limits its own address space to what it maps plus 64 MiB, then reads it."""
    child = (
        "import resource\n"
        "from llmc_trace.core.memory_limit import memory_limit\n"
        "mapped = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (mapped + (64 << 20), resource.RLIM_INFINITY))\n"
        "found = memory_limit()\n"
        "print(found.source, found.limit_bytes - mapped, found.available_bytes)\n"
    )
    ran = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    source, limit, available = ran.stdout.rsplit(maxsplit=2)
    assert source == "ulimit -v" and int(limit) == 64 << 20
    assert (64 << 20) - (8 << 20) < int(available) <= 64 << 20  # the reading maps a little


def test_a_run_over_its_memory_limit_stops_before_reading_a_weight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, one_thread: None
) -> None:
    """The limit (as read above) leaves 64 KiB: the plan's sequential peak does not fit, and
    the run stops with its figures before calibrating, nothing written."""
    folder = bf16_llama(tmp_path / "model", layers=2, hidden=64)
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).integers(0, 256, size=(8, 32)))
    tight = MemoryLimit(64 << 10, 1 << 30, "ulimit -v")
    monkeypatch.setattr(stage_run, "memory_limit", lambda: tight)
    read: list[str] = []
    original = WeightStore.read

    def reading(store: WeightStore, names: list[str], *args: object, **kwargs: object) -> object:
        read.extend(names)
        return original(store, names, *args, **kwargs)

    monkeypatch.setattr(WeightStore, "read", reading)
    out = tmp_path / "out"
    request = CompressRequest(
        folder, tmp_path / "calib.npy", out, samples=8, seq_len=32, group_size=32
    )
    with pytest.raises(BadInputError) as raised:
        compress(request)
    said = raised.value.message
    assert "of host memory (sequential, of which" in said and "cached activations" in said
    assert "the memory limit (ulimit -v, 1.0 GiB) leaves 64.0 KiB; nothing was loaded" in said
    assert not [name for name in read if name.endswith(".weight")]  # buffers only
    assert not out.exists() and not list(tmp_path.glob(".out*"))
