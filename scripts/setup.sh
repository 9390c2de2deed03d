#!/usr/bin/env bash
# Install everything llmc-trace needs on a fresh Debian machine: graphviz (dot) and Chromium
# (for the HTML view's browser test) from Debian, then the project's own virtual environment
# (.venv: nothing lands in the system's Python) with the CPU build of torch first (a plain
# "torch" requirement would pull a multi-GB CUDA build) and the package with its test and
# documentation extras.
# Afterwards: `. .venv/bin/activate`.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v apt-get >/dev/null 2>&1; then
    missing=()
    command -v dot >/dev/null 2>&1 || missing+=(graphviz)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    if [ ${#missing[@]} -gt 0 ]; then
        sudo_cmd=""
        [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
        $sudo_cmd apt-get update -qq
        $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
python=.venv/bin/python
"$python" -m pip install -q --disable-pip-version-check --upgrade pip
"$python" -c "import torch" 2>/dev/null ||
    "$python" -m pip install -q --disable-pip-version-check torch==2.13.0
"$python" -m pip install -q --disable-pip-version-check -e ".[test,docs]"
"$python" - <<'EOF'
from importlib.metadata import version

names = ("torch", "transformers", "compressed-tensors", "numpy", "datasets")
print("installed in .venv:", ", ".join(f"{name} {version(name)}" for name in names))
EOF
