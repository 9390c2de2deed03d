"""Drawn calibration images: each caption says what its image shows, and a seed redraws them.

The reference for a caption is the picture itself: the pixels of the named colour, counted as
separate runs along the row through the shapes' centres, and their centre against the named
region.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from llmc_trace.data.drawn import (
    COLOUR_SHIFT,
    COLOURS,
    CORNERS,
    COUNTS,
    MAX_OFFSET,
    POSITIONS,
    SIZES,
    draw_captioned_scene,
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
        assert 96 * (centre_x - 0.25) <= xs.min() and xs.max() < 96 * (centre_x + 0.25), row
        assert 96 * (centre_y - 0.25) <= ys.min() and ys.max() < 96 * (centre_y + 0.25), row
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


def test_a_scene_names_each_corners_group_in_reading_order(tmp_path):
    """Each group the caption names ("<count> <colour> <shape(s)> at the <corner>", joined by
    "and") is in its corner's quarter of the image, in its colour, with its count of shapes;
    the corners it does not name are white, and names come in ``CORNERS`` order."""
    rows_path = write_drawn_dataset(
        tmp_path, count=60, seed=4, sizes=((96, 96),), varied=True, groups=2
    )
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        pixels = np.asarray(Image.open(tmp_path / row["image"]).convert("RGB"))
        groups = row["text"].removesuffix(" .").split(" and ")
        named = {}
        for group in groups:
            words = group.split()
            named[" ".join(words[5:])] = (COUNTS.index(words[0]) + 1, words[1])
        assert list(named) == [corner for corner in CORNERS if corner in named], row
        assert len(named) == 2, row
        for corner in CORNERS:
            centre_x, centre_y = POSITIONS[corner]
            left, top = int(96 * (centre_x - 0.25)), int(96 * (centre_y - 0.25))
            quarter = pixels[top : top + 48, left : left + 48]
            white = np.all(quarter == 255, axis=-1)
            if corner not in named:
                assert white.all(), (row, corner)
                continue
            count, colour = named[corner]
            painted = painted_pixels(quarter, colour, COLOUR_SHIFT)
            assert (painted | white).all() and painted.any(), (row, corner)
            ys, _ = np.nonzero(painted)
            through = painted[int(round(ys.mean()))].astype(int)
            assert int((np.diff(np.concatenate([[0], through])) == 1).sum()) == count, row


def test_a_scene_has_one_to_four_groups():
    rng = np.random.default_rng(0)
    _, caption = draw_captioned_scene(rng, (96, 96), groups=4)
    assert caption.count(" and ") == 3
    with pytest.raises(ValueError, match="a scene holds 1 to 4 groups, not 5"):
        draw_captioned_scene(rng, (96, 96), groups=5)
