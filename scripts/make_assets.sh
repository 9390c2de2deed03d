#!/usr/bin/env bash
# Draw every picture in assets/ with `llmc-trace render` (the guides and the README show them).
# Each picture is an SVG built from a model's config alone, so a rerun writes the same bytes;
# render replaces a file only once it is complete. Any failing render stops the script.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v llmc-trace >/dev/null || { echo "llmc-trace is not installed: run scripts/setup.sh, then . .venv/bin/activate" >&2; exit 2; }
mkdir -p assets

render() {
    echo "+ llmc-trace render $*" >&2
    llmc-trace render "$@"
}

# Sequential targets at two granularities: one decoder layer per subgraph, then four.
render --model facebook/opt-125m --out assets/targets-one-layer-per-subgraph.svg
render --model facebook/opt-125m --targets-per-subgraph 4 --out assets/targets-four-layers-per-subgraph.svg

# A vision-language model: where tracing stops, what tracing does with each module, and the
# subgraphs once get_rope_index is an opaque call (the fix `attempt --fix` finds).
render --model Qwen/Qwen2-VL-2B-Instruct --modality image --view failure \
    --out assets/qwen2-vl-failure.svg
render --model Qwen/Qwen2-VL-2B-Instruct --modality image --view modules --collapse \
    --ignore Qwen2VisionTransformerPretrainedModel --ignore Qwen2VLModel.get_rope_index \
    --out assets/qwen2-vl-modules.svg
render --model Qwen/Qwen2-VL-2B-Instruct --modality image --collapse \
    --ignore Qwen2VLModel.get_rope_index --out assets/qwen2-vl-overview.svg
