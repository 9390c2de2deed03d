"""The CPU as the test suite sees it: without half-precision matrix units.

On a CPU with AVX512-BF16 or AMX, a bfloat16 checkpoint calibrates in bfloat16
(:func:`llmc_trace.pipelines.residency.compute_dtype`); elsewhere in float32. The suite hides
those units from torch's probes (``conftest.float32_cpu_forwards``), so that tests comparing
compressed weights or logits at tight tolerances give the same answer on every machine. A test
that compares a checkpoint written by a child process with one written in its own process runs
the child through this file, which hides the units there too, then runs llmc-trace's command
line (``python tests/float32_cpu.py compress ...``, or as torchrun's script).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pytest

#: torch's probes of the CPU's half-precision matrix instructions (see pipelines/residency.py)
HALF_PRECISION_PROBES = (
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_avx512_fp16_supported",
    "_is_amx_fp16_supported",
)


def hide_half_precision_units(patch: pytest.MonkeyPatch | None = None) -> None:
    """Make each probe torch has answer no: through ``patch`` when given (undone with it),
    else for the rest of the process."""
    for probe in HALF_PRECISION_PROBES:
        if patch is None:
            setattr(torch.cpu, probe, _no)
        else:
            patch.setattr(torch.cpu, probe, _no, raising=False)


def _no() -> bool:
    return False


if __name__ == "__main__":
    # run as a script, this folder leads sys.path: its packages (cli, graph, ...) must not
    # stand in for anything the command imports
    del sys.path[0]
    hide_half_precision_units()
    from llmc_trace.cli.main import main

    main()
