"""Draw small captioned images (shapes, colours, counts, positions) as calibration data.

Image calibration needs images with text about them, and nothing may be fetched: these are drawn
here with Pillow, each with a caption that says what it shows ("two red circles at the top
left."), so that the text is about the image as in a captioning dataset. `write_drawn_dataset`
writes them as PNG files and a `.jsonl` of `{"image": "images/0000.png", "text": caption}` rows
(paths relative to the `.jsonl`, the layout `load_multimodal_calibration` reads). The same seed
draws the same images and captions.

By default a caption fixes its image (one image per caption and size: enough to calibrate on).
`varied=True` also draws the shapes' size, their offset inside the named region and a small
shift of each colour channel, so that a model trained on drawn images meets images it has not
seen when it is evaluated on another seed's, and must read the picture rather than recall it.

Example::

    >>> import tempfile
    >>> rows = write_drawn_dataset(tempfile.mkdtemp(), count=3, seed=0)
    >>> rows.name
    'captions.jsonl'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image
    from PIL.ImageDraw import ImageDraw

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 180),
    "orange": (240, 140, 30),
}
SHAPES = ("circle", "square", "triangle")
COUNTS = ("one", "two", "three")
#: Where the shapes sit: name -> centre of the region as fractions of width and height.
POSITIONS: dict[str, tuple[float, float]] = {
    "top left": (0.25, 0.25),
    "top right": (0.75, 0.25),
    "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75),
    "middle": (0.5, 0.5),
}
#: Every word a caption can hold, for tokenizers made here (`data.twins`).
CAPTION_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [*COLOURS, *SHAPES, *(s + "s" for s in SHAPES), *COUNTS, "a", "at", "the", "in"]
        + [word for position in POSITIONS for word in position.split()]
        + ["on", "white", "background", ".", "and"]
    )
)
#: The regions a scene's groups sit in (`draw_captioned_scene`), in the reading order its
#: caption names them in; their half-width, half-height boxes do not overlap.
CORNERS: tuple[str, ...] = tuple(position for position in POSITIONS if position != "middle")
#: Image sizes (width, height) drawn in turn: three sizes, so that a calibration set built from
#: consecutive rows holds images of different sizes (different patch grids), one of them wide
#: enough that tiling processors (Idefics3) cut it into fewer tiles than the others.
SIZES: tuple[tuple[int, int], ...] = ((112, 112), (168, 112), (224, 84))


#: How far `varied` drawing moves each colour channel, at most, either way.
COLOUR_SHIFT = 20
#: How far `varied` drawing moves a group of shapes, at most, as a share of the width (of the
#: height, up or down): named points are a quarter apart, so groups of different regions keep
#: their centres a twentieth of the image apart and every caption stays decidable.
MAX_OFFSET = 0.1


def draw_captioned_image(
    rng: np.random.Generator, size: tuple[int, int], *, varied: bool = False
) -> tuple[Image, str]:
    """One image of `size` (width, height) and its caption, drawn from `rng`.

    Returns a `PIL.Image.Image` in RGB and a caption such as "two red circles at the top left.".
    `varied` draws the radius (3/4 of the fixed one up to it), the group's offset (at most
    `MAX_OFFSET` of the width and of the height, and never out of the half-width, half-height
    box around its named point) and a shift of up to `COLOUR_SHIFT` per colour channel (see the
    module docstring); the caption's words are drawn as without it.
    """
    from PIL import Image as PILImage
    from PIL import ImageDraw

    colour = str(rng.choice(list(COLOURS)))
    shape = str(rng.choice(SHAPES))
    count = int(rng.integers(1, len(COUNTS) + 1))
    position = str(rng.choice(list(POSITIONS)))
    image = PILImage.new("RGB", size, (255, 255, 255))
    _draw_group(ImageDraw.Draw(image), rng, size, count, colour, shape, position, varied)
    return image, _group_caption(count, colour, shape, position) + " ."


def draw_captioned_scene(
    rng: np.random.Generator, size: tuple[int, int], groups: int = 2, *, varied: bool = False
) -> tuple[Image, str]:
    """One image of `size` holding `groups` groups of shapes, each in another of the `CORNERS`
    and drawn as `draw_captioned_image` draws its one, and a caption naming them in reading
    order: "one red circle at the top left and two blue squares at the bottom right .".

    The corners are drawn uniformly among the sets of `groups`, and each group's count, colour
    and shape as for one image, independently of the other groups'.
    """
    from PIL import Image as PILImage
    from PIL import ImageDraw

    if not 1 <= groups <= len(CORNERS):
        raise ValueError(f"a scene holds 1 to {len(CORNERS)} groups, not {groups}")
    image = PILImage.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(image)
    parts = []
    for corner in sorted(rng.choice(len(CORNERS), size=groups, replace=False)):
        colour = str(rng.choice(list(COLOURS)))
        shape = str(rng.choice(SHAPES))
        count = int(rng.integers(1, len(COUNTS) + 1))
        position = CORNERS[int(corner)]
        _draw_group(draw, rng, size, count, colour, shape, position, varied)
        parts.append(_group_caption(count, colour, shape, position))
    return image, " and ".join(parts) + " ."


def _group_caption(count: int, colour: str, shape: str, position: str) -> str:
    noun = shape if count == 1 else shape + "s"
    return f"{COUNTS[count - 1]} {colour} {noun} at the {position}"


def _draw_group(
    draw: ImageDraw,
    rng: np.random.Generator,
    size: tuple[int, int],
    count: int,
    colour: str,
    shape: str,
    position: str,
    varied: bool,
) -> None:
    """Draw `count` shapes in a row around `position`'s point (`varied` as for
    `draw_captioned_image`, its draws taken from `rng`)."""
    width, height = size
    # three shapes and their gaps span at most 7 radii, half the width: they stay inside their
    # half of the image and apart from each other (a gap of 2 pixels or more)
    radius = max(4, min(width // 14, height // 10))
    fill = COLOURS[colour]
    shift_x = shift_y = 0
    if varied:
        radius = int(rng.integers(max(3, radius * 3 // 4), radius + 1))
    step = 2 * radius + max(2, radius // 2)
    if varied:
        # the group moves only as far as keeps it inside a region of half the width and height
        # (a shape of radius r covers 2r + 1 pixels: Pillow paints both edges of its box)
        slack_x = max(0, (width // 2 - (count - 1) * step - 2 * radius - 1) // 2)
        slack_y = max(0, (height // 2 - 2 * radius - 1) // 2)
        slack_x = min(slack_x, int(MAX_OFFSET * width))
        slack_y = min(slack_y, int(MAX_OFFSET * height))
        shift_x = int(rng.integers(-slack_x, slack_x + 1))
        shift_y = int(rng.integers(-slack_y, slack_y + 1))
        shifted = np.asarray(fill) + rng.integers(-COLOUR_SHIFT, COLOUR_SHIFT + 1, size=3)
        fill = tuple(int(c) for c in np.clip(shifted, 0, 255))
    centre_x, centre_y = POSITIONS[position]
    for index in range(count):
        x = int(round(width * centre_x + (index - (count - 1) / 2) * step)) + shift_x
        y = int(height * centre_y) + shift_y
        box = (x - radius, y - radius, x + radius, y + radius)
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x, y - radius), (x - radius, y + radius), (x + radius, y + radius)],
                         fill=fill)  # fmt: skip


def write_drawn_dataset(
    folder: str | Path,
    count: int = 8,
    *,
    seed: int = 0,
    sizes: Sequence[tuple[int, int]] = SIZES,
    name: str = "captions.jsonl",
    varied: bool = False,
    groups: int | None = None,
) -> Path:
    """Draw `count` images into `folder/images/` and write `folder/name` with one row each.

    Rows are `{"image": "images/0000.png", "text": caption}`; image `i` has size
    `sizes[i % len(sizes)]`; `varied` as for `draw_captioned_image`. With `groups`, each image
    is a scene of that many groups (`draw_captioned_scene`). Returns the path of the `.jsonl`
    file.
    """
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        size = tuple(sizes[index % len(sizes)])
        if groups is None:
            image, caption = draw_captioned_image(rng, size, varied=varied)
        else:
            image, caption = draw_captioned_scene(rng, size, groups, varied=varied)
        relative = f"images/{index:04d}.png"
        image.save(folder / relative, format="PNG")
        rows.append({"image": relative, "text": caption})
    path = folder / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
