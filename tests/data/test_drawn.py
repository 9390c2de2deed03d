"""Drawn calibration images: each caption says what its image shows, and a seed redraws them.

The reference for a caption is the picture itself: the pixels of the named colour, counted as
separate runs along the row through the shapes' centres, and their centre against the named
region.
"""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from llmc_trace.data.drawn import COLOURS, COUNTS, POSITIONS, SIZES, write_drawn_dataset


def test_captions_say_what_the_images_show(tmp_path):
    rows_path = write_drawn_dataset(tmp_path, count=40, seed=3)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    for index, row in enumerate(rows):
        pixels = np.asarray(Image.open(tmp_path / row["image"]).convert("RGB"))
        assert pixels.shape[:2] == SIZES[index % len(SIZES)][::-1]
        words = row["text"].split()
        count, colour = COUNTS.index(words[0]) + 1, words[1]
        position = " ".join(words[5:-1])  # "<count> <colour> <shape(s)> at the <position> ."
        painted = np.all(pixels == COLOURS[colour], axis=-1)  # (H, W)
        ys, xs = np.nonzero(painted)
        height, width = painted.shape
        centre_x, centre_y = POSITIONS[position]
        assert abs(ys.mean() / height - centre_y) < 0.15 and abs(xs.mean() / width - centre_x) < 0.2
        row_through = painted[int(round(height * centre_y))].astype(int)
        runs = int((np.diff(np.concatenate([[0], row_through])) == 1).sum())
        assert runs == count, row


def test_same_seed_same_files(tmp_path):
    first = write_drawn_dataset(tmp_path / "a", count=4, seed=1)
    again = write_drawn_dataset(tmp_path / "b", count=4, seed=1)
    other = write_drawn_dataset(tmp_path / "c", count=4, seed=2)
    assert first.read_text() == again.read_text() != other.read_text()
    for name in (f"images/{i:04d}.png" for i in range(4)):
        assert (first.parent / name).read_bytes() == (again.parent / name).read_bytes()
