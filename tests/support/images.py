"""A generated image task: a folder of class folders of small PNGs, as a user's image data arrives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 60, 230)}


def shapes(folder: Path, per_class: int = 20) -> None:
    """<folder>/<colour>/<i>.png: 8x8 squares of a colour at random places on a noisy background."""
    rng = np.random.default_rng(0)
    for name, colour in COLOURS.items():
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            x = rng.integers(0, 60, (8, 8, 3))
            top, left, size = rng.integers(0, 4), rng.integers(0, 4), rng.integers(3, 5)
            x[top : top + size, left : left + size] = colour
            Image.fromarray(x.astype(np.uint8)).save(folder / name / f"{i:02d}.png")
