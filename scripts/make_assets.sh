#!/usr/bin/env bash
# Draw every picture in assets/ with `llmc-trace render` (the guides and the README show them).
# Each picture but the compression report's (a compress run of the reference model, last) is an
# SVG built from a model's config alone, so a rerun writes the same bytes
# (the page's picture: on the same machine, as Chromium lays its text out with local fonts);
# render replaces a file only once it is complete. Any failing render stops the script.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v llmc-trace >/dev/null || { echo "llmc-trace is not installed: run scripts/setup.sh, then . .venv/bin/activate" >&2; exit 2; }
mkdir -p assets

render() {
    echo "+ llmc-trace render $*" >&2
    llmc-trace render "$@"
}

# Sequential targets at two granularities: one decoder layer per subgraph, then four (every
# subgraph drawn: counting them is the point).
render --model facebook/opt-125m --expand --out assets/targets-one-layer-per-subgraph.svg
render --model facebook/opt-125m --targets-per-subgraph 4 --expand \
    --out assets/targets-four-layers-per-subgraph.svg

# A vision-language model: where tracing stops, what tracing does with each module, and the
# subgraphs once get_rope_index is an opaque call (the fix `attempt --fix` finds).
render --model Qwen/Qwen2-VL-2B-Instruct --modality image --view failure \
    --out assets/qwen2-vl-failure.svg
render --model Qwen/Qwen2-VL-2B-Instruct --modality image --view modules \
    --tracing-ignore Qwen2VisionTransformerPretrainedModel --tracing-ignore Qwen2VLModel.get_rope_index \
    --out assets/qwen2-vl-modules.svg
render --model Qwen/Qwen2-VL-2B-Instruct --modality image \
    --tracing-ignore Qwen2VLModel.get_rope_index --out assets/qwen2-vl-overview.svg

# The same model's decisions with an image, as the source view shows them (guides/decisions.md):
# the page opened at Qwen2VLModel.forward's multimodal branches, captured by headless Chromium
# (a PNG: the view is a page of text, not a graph).
page="$(mktemp -d)/qwen2-vl-source.html"
render --model Qwen/Qwen2-VL-2B-Instruct --modality image \
    --tracing-ignore Qwen2VLModel.get_rope_index --view source --out "$page"
chromium --headless --disable-gpu --no-sandbox --hide-scrollbars --window-size=1400,860 \
    --screenshot=assets/qwen2-vl-decisions.png "file://$page#L-Qwen2VLModel.forward-1141" 2>/dev/null
rm -r "$(dirname "$page")"

# A deep model's page, which opens folded: saved with the last layer unfolded into its
# operations and its call into the layer's modules, down to the attention's projections.
page="$(mktemp -d)/llama-3.1-70b.html"
render --model meta-llama/Llama-3.1-70B --out "$page"
python scripts/page_picture.py "$page" assets/llama-3.1-70b-page.svg \
    --unfold n-model_layers_79,m-model.layers.79.self_attn
rm -r "$(dirname "$page")"

# The compression report's overview: the reference model compressed with W4A16 (the README's
# "Compression report"), its report drawn; the losses are this machine's (float summation
# order), the layout the report's.
out="$(mktemp -d)/refmodel-w4a16"
llmc-trace --quiet compress -m refmodel -d refmodel/calib.npy -o "$out" >/dev/null
render --report "$out/report.json" --out assets/compression-report.svg
rm -r "$(dirname "$out")"
