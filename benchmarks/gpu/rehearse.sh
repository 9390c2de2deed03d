#!/usr/bin/env bash
# Rehearse the device call here, in a Python built like the GPU machine's, before a GPU is lent.
#
# The device call has one try (README.md, section 2) and runs on the machine's own packages:
# Python 3.12 with torch 2.11, Triton 3.6, transformers 5.17 and numpy 2.5 (device_packages.txt),
# not this checkout's torch 2.13 and transformers 5.24. This builds a venv with those releases
# (torch 2.11 from PyPI is its CUDA build, about 3 GB; it runs on the CPU), builds the wheels
# for Python 3.12, and runs there what the device call runs that a CPU can: the dry run from
# the installed wheels, then the CPU tests of every file holding a CUDA test, with the source
# first on the path. What differs from this checkout's environment shows up here, not in the
# call: Triton 3.6's interpreter, for one, cannot run with numpy 2.4 or later (the kernel tests
# say so and skip; the compiled kernel on a GPU is unaffected), so the interpreted kernel test
# runs once more with numpy 2.3 first on the path.
#
# Idempotent: a venv that already has the pinned releases is reused.
#
#     bash benchmarks/gpu/rehearse.sh            # -> out/gpu-rehearsal/ (summary.txt, tests.log)
#
# wheels.py runs in the project's .venv ($PYTHON to name another Python that has the project).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${REHEARSAL_VENV:-$HOME/.cache/llmc-trace/venv-gpu-rehearsal}"
out="$repo/out/gpu-rehearsal"
# the machine's releases (device_packages.txt's header), then what the tests import there
pins=(torch==2.11.0 triton==3.6.0 transformers==5.17.0 tokenizers==0.23.2
      huggingface_hub==1.33.0 safetensors==0.8.0 numpy==2.5.2)
more=(networkx psutil pillow click rich pyyaml datasets accelerate scipy
      pytest pytest-xdist hypothesis websocket-client)

find_python312() {
    for candidate in "${PYTHON312:-}" python3.12 "$(pyenv prefix 3.12 2>/dev/null)/bin/python3.12"; do
        if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no Python 3.12 found (the GPU machine's): set PYTHON312 to one" >&2
    return 1
}

is_ready() {
    [ -x "$venv/bin/python" ] || return 1
    "$venv/bin/python" - "${pins[@]}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version

for pin in sys.argv[1:]:
    name, wanted = pin.split("==")
    assert version(name) == wanted, pin
EOF
}

marker="$venv/.llmc-gpu-rehearsal"  # written here: only such a venv is ever rebuilt
if ! is_ready; then
    if [ -e "$venv" ] && [ ! -e "$marker" ]; then
        echo "$venv exists and was not made by this script: set REHEARSAL_VENV elsewhere" >&2
        exit 1
    fi
    python312="$(find_python312)"
    rm -rf "$venv"
    "$python312" -m venv "$venv"
    touch "$marker"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet "${pins[@]}"
fi
"$venv/bin/pip" install --quiet "${pins[@]}" "${more[@]}"  # what the tests import; quick when there
# the machine has no pydantic: the carried wheels bring it, as they do there
"$venv/bin/pip" uninstall --quiet --yes pydantic pydantic-core annotated-types typing-inspection \
    2>/dev/null || true
is_ready || { echo "the rehearsal venv does not hold ${pins[*]}" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
wheels="$out/wheels"
"${PYTHON:-$repo/.venv/bin/python}" "$here/wheels.py" --out "$wheels" --python-version 3.12
"$venv/bin/python" "$here/run.py" --dry-run --wheels "$wheels" --target "$out/site" \
    --work "$out/work" --out "$out/run"
cp "$out/run/summary.txt" "$out/summary.txt"

cd "$repo"
# the test files holding a CUDA test, as run.py's cuda_tests step selects them
mapfile -t files < <(grep -lE 'mark\.cuda\b|cuda\.is_available\(' -r tests --include='test_*.py' | sort)
# Triton 3.6's interpreter runs the kernel with numpy before 2.4: the kernel check once more,
# below, with such a numpy first on the path, so this Triton's reading of the kernel is checked
"$venv/bin/pip" install --quiet --no-deps --target "$out/numpy-2.3" numpy==2.3.5
status=0
env -u PYTHONDONTWRITEBYTECODE PYTHONPATH="$repo/src:$out/site" "$venv/bin/python" -m pytest \
    -q -rs -p no:cacheprovider -n 2 "${files[@]}" tests/algorithms tests/test_gpu_benchmark.py \
    > "$out/tests.log" 2>&1 || status=$?
env -u PYTHONDONTWRITEBYTECODE PYTHONPATH="$out/numpy-2.3:$repo/src:$out/site" "$venv/bin/python" \
    -m pytest -q -rs -p no:cacheprovider tests/algorithms/test_interpreted_kernels.py \
    >> "$out/tests.log" 2>&1 || status=$?
tail -n 25 "$out/tests.log"
echo "rehearsal in $out: the dry run's table in summary.txt, the tests in tests.log (exit $status)"
exit "$status"
