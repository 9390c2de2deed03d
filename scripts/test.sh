#!/usr/bin/env bash
# Install everything and run every check CI runs (.ci/run calls this on a clean clone):
# the test suite; the documentation site, built strictly (a broken link or API reference
# fails); the docs' results tables against their result files; then vLLM's CPU build serving
# the checkpoints llmc-trace writes, which must agree with our perplexity (its venv is kept
# between runs in $LLMC_VLLM_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite starts about fifty interpreters (CLI commands, torchrun ranks, fresh-import
# checks): with bytecode caches turned off, as some sandboxes do, each compiles llmc-trace's
# sources again and each pytest worker rewrites every test module's asserts, about a CPU
# minute of the suite's twenty. Python's caches go to __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE

step() {
    echo
    echo "+ $*"
    "$@"
}

step bash scripts/setup.sh
. .venv/bin/activate
step python -m pytest -q -n 2 --dist worksteal --durations=15
export NO_MKDOCS_2_WARNING=1  # the theme's notice about its successor, printed on every build
step mkdocs build --strict --quiet --site-dir "$(mktemp -d)/site"
step python benchmarks/tables.py --check
export LLMC_VLLM_VENV="${LLMC_VLLM_VENV:-$HOME/.cache/llmc-trace/venv-vllm-0.32.0}"
step bash benchmarks/vllm_env.sh
step python benchmarks/vllm_serving.py --ci
