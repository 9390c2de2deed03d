"""vLLM's GPU build serving each compressed-tensors preset's checkpoint (not a step of ``run.py``).

The GPU counterpart of ``benchmarks/scheme_presets.py``: the same rows (each preset written by
``llmc-trace compress --method rtn``, reloaded by transformers, scored by llmc-trace and by
vLLM), with vLLM's CUDA kernels instead of its CPU build's, which lacks the FP8 block, NVFP4
and MX ones, and the weight-only integer ones on CPUs without AVX512 (the CPU table says which). It needs a machine where ``import vllm`` gives a CUDA build:
the device machine lent here has no vLLM, and its wheel is far over what a device call carries,
so the script checks that first and says so instead of failing midway.

vLLM runs in this Python (``sys.prefix`` stands for the CPU run's separate venv), each
checkpoint in a fresh worker process (``benchmarks/_reference/serve_vllm.py``), on the GPU
vLLM picks. The result goes to ``--out`` (``scheme_presets-gpu.json``), to be kept as
``benchmarks/gpu/README.md`` section 3 says.

    python3 benchmarks/gpu/vllm_schemes.py --out $OUT                       # every preset
    python3 benchmarks/gpu/vllm_schemes.py --out $OUT --presets FP8_BLOCK NVFP4A16
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the result file")
    parser.add_argument("--presets", nargs="+", help="default: every preset")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed in this Python: nothing to serve with (see the docstring).")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, str(BENCHMARKS / "scheme_presets.py"),
        "--result", str(args.out / "scheme_presets-gpu.json"),
    ]  # fmt: skip
    if args.presets:
        command += ["--presets", *args.presets]
    environment = {**os.environ, "LLMC_VLLM_VENV": sys.prefix}
    return subprocess.run(command, env=environment).returncode


if __name__ == "__main__":
    sys.exit(main())
