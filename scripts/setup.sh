#!/usr/bin/env bash
# Install everything llmc-trace needs on a fresh Debian machine: graphviz (dot) and Chromium
# (for the HTML view's browser test), the CPU build of torch first (a plain "torch"
# requirement would pull a multi-GB CUDA build), then the package with its test extras.
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

python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
