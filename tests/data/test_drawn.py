"""Drawn calibration images: each caption says what its image shows, and a seed redraws them.

The reference for a caption is the picture itself: the pixels of the named colour, counted as
separate runs along the row through the shapes' centres, and their centre against the named
region.
"""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from llmc_trace.data.drawn import (
    COLOUR_SHIFT,
    COLOURS,
    COUNTS,
    MAX_OFFSET,
    POSITIONS,
    SIZES,
    write_drawn_dataset,
)


def painted_pixels(pixels: np.ndarray, colour: str, tolerance: int = 0) -> np.ndarray:
    """Where the image holds the named colour, each channel within ``tolerance`` of it."""
    return np.all(np.abs(pixels.astype(int) - COLOURS[colour]) <= tolerance, axis=-1)


def test_captions_say_what_the_images_show(tmp_path):
    rows_path = write_drawn_dataset(tmp_path, count=40, seed=3)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    for index, row in enumerate(rows):
        pixels = np.asarray(Image.open(tmp_path / row["image"]).convert("RGB"))
        assert pixels.shape[:2] == SIZES[index % len(SIZES)][::-1]
        words = row["text"].split()
        count, colour = COUNTS.index(words[0]) + 1, words[1]
        position = " ".join(words[5:-1])  # "<count> <colour> <shape(s)> at the <position> ."
        painted = painted_pixels(pixels, colour)  # (H, W)
        ys, xs = np.nonzero(painted)
        height, width = painted.shape
        centre_x, centre_y = POSITIONS[position]
        assert abs(ys.mean() / height - centre_y) < 0.15 and abs(xs.mean() / width - centre_x) < 0.2
        row_through = painted[int(round(height * centre_y))].astype(int)
        runs = int((np.diff(np.concatenate([[0], row_through])) == 1).sum())
        assert runs == count, row


def test_varied_images_stay_in_their_region_in_their_colour_and_vary(tmp_path):
    """Every painted pixel lies inside the half-width, half-height box around the named point
    and within ``COLOUR_SHIFT`` of the named colour (which no other colour comes near), the
    middle of the group's bounding box within ``MAX_OFFSET`` of the point, the count of shapes
    is the caption's, and images of one caption differ."""
    rows_path = write_drawn_dataset(tmp_path, count=200, seed=5, sizes=((96, 96),), varied=True)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    captions, images = set(), set()
    for row in rows:
        pixels = np.asarray(Image.open(tmp_path / row["image"]).convert("RGB"))
        words = row["text"].split()
        count, colour = COUNTS.index(words[0]) + 1, words[1]
        centre_x, centre_y = POSITIONS[" ".join(words[5:-1])]
        white = np.all(pixels == 255, axis=-1)
        painted = painted_pixels(pixels, colour, COLOUR_SHIFT)
        assert (painted | white).all(), row  # one colour, and none of another within reach
        assert all(
            not painted_pixels(pixels, other, COLOUR_SHIFT).any()
            for other in COLOURS
            if other != colour
        ), row
        ys, xs = np.nonzero(painted)
        assert 96 * (centre_x - 0.25) <= xs.min() and xs.max() <= 96 * (centre_x + 0.25), row
        assert 96 * (centre_y - 0.25) <= ys.min() and ys.max() <= 96 * (centre_y + 0.25), row
        middle_x, middle_y = (xs.min() + xs.max()) / 2, (ys.min() + ys.max()) / 2
        assert abs(middle_x - 96 * centre_x) <= 96 * MAX_OFFSET + 1, row
        assert abs(middle_y - 96 * centre_y) <= 96 * MAX_OFFSET + 1, row
        through = painted[int(round(ys.mean()))].astype(int)  # a row through the shapes
        assert int((np.diff(np.concatenate([[0], through])) == 1).sum()) == count, row
        captions.add(row["text"])
        images.add(pixels.tobytes())
    assert len(captions) < len(rows) == len(images)  # captions repeat, images do not


def test_same_seed_same_files(tmp_path):
    first = write_drawn_dataset(tmp_path / "a", count=4, seed=1)
    again = write_drawn_dataset(tmp_path / "b", count=4, seed=1)
    other = write_drawn_dataset(tmp_path / "c", count=4, seed=2)
    assert first.read_text() == again.read_text() != other.read_text()
    for name in (f"images/{i:04d}.png" for i in range(4)):
        assert (first.parent / name).read_bytes() == (again.parent / name).read_bytes()
