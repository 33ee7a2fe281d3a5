"""Whole-array merges the tests compare run's streaming merges with (the product merges stream: runtime/chunking)."""

from __future__ import annotations

import numpy as np

from trtforge.core.errors import UserError
from trtforge.runtime.chunking import MERGES, StreamingMerge, Window, plan_windows, window_weights


def merge_windows(outputs: list[np.ndarray], windows: list[Window], length: int, merge: str = "center", axis: int = 0) -> np.ndarray:
    """Put per-window outputs (window positions along `axis`) back into one array of `length` positions."""
    if merge not in MERGES:
        raise UserError(f"unknown merge '{merge}'; use one of {', '.join(MERGES)}.")
    merger = StreamingMerge(windows, length, merge)
    for i, out in enumerate(outputs):
        merger.add(i, np.moveaxis(out, axis, 0))
    return np.moveaxis(merger.result(), 0, axis)


def tile_weight_maps(height: int, width: int, tile: int, overlap: int, merge: str) -> list[np.ndarray]:
    """Separable per-tile weights (rows x cols), normalised to sum to 1 at every pixel.

    'linear' and 'cosine' ramp across the overlaps; 'gaussian' weights each tile by a Gaussian bump
    centred on it, so every seam is a smooth cross-fade.
    """
    kind = merge
    rows = plan_windows(height, tile, overlap)
    cols = plan_windows(width, tile, overlap)
    row_w = window_weights(rows, height, kind)
    col_w = window_weights(cols, width, kind)
    return [np.outer(rw, cw) for rw in row_w for cw in col_w]
