#!/usr/bin/env bash
# Create benchmarks/.venv-llmc: llm-compressor 0.14.0.1 beside llmc-trace's own CPU torch.
#
# The benchmarks compare llmc-trace with llm-compressor measured in the same run; this venv is
# where llm-compressor runs. A .pth file puts the site-packages of the Python that runs
# llmc-trace (the project's .venv when it is active, else $PYTHON or the system's) behind its
# own, so it shares that torch (2.13 CPU) and transformers, and the two tools trace the very
# same modelling code; what it installs itself (compressed-tensors 0.19) comes first.
#
# llmcompressor, compressed-tensors, accelerate and auto-round declare a torch requirement that
# pip would satisfy with a multi-gigabyte CUDA wheel, so they are installed with --no-deps and
# their pure-Python requirements are listed here explicitly (from `pip show` Requires of each).
# llmcompressor 0.14.0.1 pins transformers<=5.17.0; we keep the system's newer transformers
# (pip reports the conflict) so that both tools trace identical model code. Set
# LLMC_REF_TRANSFORMERS=5.17.0 to install the pinned version into the venv instead.
#
# Idempotent: a venv that already imports the pinned versions is left as it is.
#
#     bash benchmarks/reference_env.sh
#     benchmarks/.venv-llmc/bin/python -c "import llmcompressor"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-llmc"
system_python="${PYTHON:-python}"
LLMCOMPRESSOR_VERSION=0.14.0.1
COMPRESSED_TENSORS_VERSION=0.19.0

is_ready() {
    [ -x "$venv/bin/python" ] || return 1
    "$venv/bin/python" - "$LLMCOMPRESSOR_VERSION" "$COMPRESSED_TENSORS_VERSION" \
        "${LLMC_REF_TRANSFORMERS:-}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version

want_llmc, want_ct, want_transformers = sys.argv[1:4]
assert version("llmcompressor") == want_llmc
assert version("compressed-tensors") == want_ct
assert not want_transformers or version("transformers") == want_transformers
from llmcompressor.pipelines.sequential.helpers import trace_subgraphs  # noqa: F401
EOF
}

if is_ready; then
    echo "reference venv ready: $venv"
    exit 0
fi

shared_site="$("$system_python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')" || {
    echo "$system_python cannot import torch: run scripts/setup.sh and . .venv/bin/activate first" >&2
    exit 2
}
[ -x "$venv/bin/python" ] || "$system_python" -m venv "$venv"
own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$shared_site" >"$own_site/_llmc_trace_shared.pth"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --quiet)

# torch-heavy packages: never let pip resolve torch
"${pip[@]}" --no-deps \
    "llmcompressor==$LLMCOMPRESSOR_VERSION" \
    "compressed-tensors==$COMPRESSED_TENSORS_VERSION" \
    "accelerate>=1.15.0" \
    "auto-round>=0.14.1,<=0.15.1"

# their pure-Python requirements (most are already in the system site-packages)
"${pip[@]}" \
    "loguru>=0.7.2" "pyyaml>=6.0.1" "numpy>=2.0.0" "requests>=2.32.2" "tqdm>=4.66.3" \
    "datasets>=4.8.4" "nvidia-ml-py>=12.560.30" "pillow>=10.4.0" \
    "pydantic>=2.0" psutil packaging "huggingface_hub>=0.21.0" "safetensors>=0.4.3" py-cpuinfo

if [ -n "${LLMC_REF_TRANSFORMERS:-}" ]; then
    "${pip[@]}" "transformers==$LLMC_REF_TRANSFORMERS"
fi

if ! is_ready; then
    echo "reference venv $venv does not import llmcompressor's trace_subgraphs:" >&2
    "$venv/bin/python" -c \
        "from llmcompressor.pipelines.sequential.helpers import trace_subgraphs" >&2 || true
    exit 1
fi
"$venv/bin/python" - <<'EOF'
from importlib.metadata import version

import torch

names = ("llmcompressor", "compressed-tensors", "transformers")
print("reference venv ready:", ", ".join(f"{n} {version(n)}" for n in names), f"torch {torch.__version__}")
EOF
