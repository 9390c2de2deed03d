"""llmc-trace's reference model: a small Llama trained here on the Python standard library.

Tests, benchmarks and the README measure compression quality on it (see ``README.md`` in this
folder for how it was made and what it measures; ``train.py`` remakes it). ``FOLDER`` is the one
place its location is named.
"""

from pathlib import Path

#: The folder holding the model, its tokenizer and its calibration and evaluation token arrays.
FOLDER = Path(__file__).resolve().parent
