"""llmc-trace's reference models: a small Llama trained here on the Python standard library,
its mixture-of-experts variant trained the same way on the same data, and a small LLaVA trained
here to caption drawn images.

Tests, benchmarks and the README measure compression quality on them (see ``README.md`` in this
folder for how they were made and what they measure; ``train.py`` and ``train_vlm.py`` remake
them). ``FOLDER``, ``MOE_FOLDER`` and ``VLM_FOLDER`` are the one place their locations are named.
"""

from pathlib import Path

#: The folder holding the model, its tokenizer and its calibration and evaluation token arrays.
FOLDER = Path(__file__).resolve().parent

#: The mixture-of-experts variant (``Qwen3MoeForCausalLM``, 8 experts, 2 per token): its model,
#: a copy of ``FOLDER``'s tokenizer, and its results; its ``calib.npy``, ``eval.npy`` and
#: ``split.json`` are ``FOLDER``'s, read from there (not copied: the repository travels to GPU
#: machines under a size limit).
MOE_FOLDER = FOLDER / "moe"

#: The vision-language model (``LlavaForConditionalGeneration``: CLIP tower, Llama language
#: model), with its processor files and ``calib/`` and ``eval/`` folders of captioned images.
VLM_FOLDER = FOLDER / "vlm"
