"""llmc-trace's reference models: a small Llama trained here on the Python standard library,
and its mixture-of-experts variant trained the same way on the same data.

Tests, benchmarks and the README measure compression quality on them (see ``README.md`` in this
folder for how they were made and what they measure; ``train.py`` remakes them). ``FOLDER`` and
``MOE_FOLDER`` are the one place their locations are named.
"""

from pathlib import Path

#: The folder holding the model, its tokenizer and its calibration and evaluation token arrays.
FOLDER = Path(__file__).resolve().parent

#: The mixture-of-experts variant (``Qwen3MoeForCausalLM``, 8 experts, 2 per token), with the
#: same files; its tokenizer, ``calib.npy``, ``eval.npy`` and ``split.json`` are ``FOLDER``'s.
MOE_FOLDER = FOLDER / "moe"
