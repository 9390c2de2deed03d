#!/usr/bin/env bash
# The main job on a fresh machine, each step printed before it runs: install everything
# (scripts/setup.sh), then trace Qwen2-VL with an image from its config alone, let llmc-trace
# find and verify the fix, draw the trace as a page, and compress the model's tiny twin
# (saved here with a processor) with GPTQ W4A16 on drawn images, then score it.
# Everything it writes goes to demo/ (or the folder given as the first argument).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-demo}"

step() {
    echo
    echo "+ $*"
    "$@"
}

step bash scripts/setup.sh
. .venv/bin/activate
mkdir -p "$out"
model=Qwen/Qwen2-VL-2B-Instruct
# 1. Does it trace with an image? It does not as written; --fix finds the opaque call that
#    makes it trace, proves it on the tiny twin, and prints the configuration to paste.
step llmc-trace attempt --model "$model" --modality image --fix || true
# 2. The trace with that fix, as a page that unfolds in place (open it in a browser).
step llmc-trace render --model "$model" --modality image \
    --tracing-ignore Qwen2VLModel.get_rope_index --out "$out/qwen2-vl.html"
# 3. A tiny random-weight twin with a tokenizer and image processor, and drawn captioned images.
step python -c "
from llmc_trace.twins import save_twin
from llmc_trace.data.drawn import write_drawn_dataset
save_twin('$model', '$out/qwen2-vl-twin')
write_drawn_dataset('$out/drawn', count=16)
"
# 4. GPTQ W4A16 calibrated on the images, through the sequential pipeline; then its perplexity.
step llmc-trace compress --model "$out/qwen2-vl-twin" --dataset "$out/drawn/captions.jsonl" \
    --samples 8 --seq-len 256 --batch-size 2 --out "$out/qwen2-vl-w4a16" --overwrite
step llmc-trace evaluate --model "$out/qwen2-vl-w4a16" --data "$out/drawn/captions.jsonl"
echo
echo "done: $out/qwen2-vl.html (the trace), $out/qwen2-vl-w4a16 (the checkpoint, report.html inside)"
