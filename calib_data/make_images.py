"""Procedural RGB images for the vision models of the zoo (no photo set can be downloaded here).

Each image is a seeded scene: a two-colour gradient background, 3-8 filled shapes (discs,
rectangles, stripes) of random colours, and mild sensor noise, so activations vary the way they do
on natural images (edges, flat regions, texture) rather than on uniform noise. Deterministic: run
`python calib_data/make_images.py` from the repository root to recreate the committed files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent


def scene(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    a, b = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3)
    angle = rng.uniform(0, np.pi)
    t = ((np.cos(angle) * x + np.sin(angle) * y) / max(height, width) + 1) / 2
    img = a[None, None] * (1 - t[..., None]) + b[None, None] * t[..., None]
    for _ in range(rng.integers(3, 9)):
        colour = rng.uniform(0, 1, 3)
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        size = rng.uniform(0.05, 0.35) * min(height, width)
        kind = rng.integers(0, 3)
        if kind == 0:
            mask = (y - cy) ** 2 + (x - cx) ** 2 < size**2
        elif kind == 1:
            mask = (abs(y - cy) < size) & (abs(x - cx) < size * rng.uniform(0.3, 1.5))
        else:
            period = rng.uniform(4, 16)
            mask = (np.sin((x * np.cos(angle) - y * np.sin(angle)) / period) > 0) & ((y - cy) ** 2 + (x - cx) ** 2 < (2 * size) ** 2)
        img[mask] = colour
    img += rng.normal(0, 0.02, img.shape)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def write(folder: str, count: int, size: tuple[int, int], seed: int, fmt: str = "png") -> None:
    out = ROOT / folder
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        image = Image.fromarray(scene(rng, *size))
        image.save(out / f"scene_{i:03d}.{fmt}", **({"quality": 90} if fmt == "jpg" else {"optimize": True}))


if __name__ == "__main__":
    write("images", 32, (96, 96), seed=1)  # calibration
    write("images_eval", 16, (96, 96), seed=2)  # held out
    write("images_large", 2, (1024, 1024), seed=3, fmt="jpg")  # tiled runs (segmentation)
