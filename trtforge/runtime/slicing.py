"""Sliced detection over large images, as SAHI does it: overlapping slices that cover the image, each slice's boxes
shifted back to image coordinates, and the boxes of all slices merged into one set. Pure numpy.

Slices are all of one size (the model's input size), so they batch together and fit one engine profile: the last
slice along an axis ends at the image's edge and overlaps its neighbour by more than the others. Boxes are rows
(x1, y1, x2, y2, score, class) in pixels (verify/boxes.py), class -1 marking rows under the score threshold.

Merging, class by class (a box never absorbs a box of another class):
- nms: the highest-scoring box is kept, every box of its class overlapping it at IoU >= `iou` is dropped, and so on;
- greedy: SAHI's greedy non-maximum merging: as nms, but each kept box grows to the union of the boxes it absorbs
  (an object cut by a slice edge is seen whole by no slice; its pieces merge into one box), keeping its own score.
"""

from __future__ import annotations

import numpy as np

from trtforge.runtime.chunking import Tile, windows_from_spans
from trtforge.verify.boxes import COLUMNS, BoxSpec, detections, iou_matrix, kept

BOX_MERGES = ("nms", "greedy")


def slice_spans(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """(start, end) of slices of `size` along an axis of `length`, consecutive ones sharing at least `overlap`: every
    slice full size, the last one ending at `length` (one slice of `length` when the axis is not longer than `size`)."""
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"slices need size >= 1 and 0 <= overlap < size, got size {size} and overlap {overlap}")
    if length <= size:
        return [(0, length)]
    stride = size - overlap
    starts = list(range(0, length - size, stride)) + [length - size]
    return [(s, s + size) for s in starts]


def slice_tiles(height: int, width: int, size: int, overlap: int) -> list[Tile]:
    """The slices covering an image, row by row, as tiles (their 'center' keep ranges are unused by box merging)."""
    rows = windows_from_spans(slice_spans(height, size, overlap))
    cols = windows_from_spans(slice_spans(width, size, overlap))
    return [Tile(r, c) for r in rows for c in cols]


def shift(rows: np.ndarray, top: float, left: float) -> np.ndarray:
    """One slice's boxes [N, 6] in pixels of the slice, moved to the image's pixels (the slice starts at top, left)."""
    out = np.array(rows, dtype=np.float64).reshape(-1, COLUMNS)
    out[:, [0, 2]] += left
    out[:, [1, 3]] += top
    return out


def merge_boxes(rows: np.ndarray, method: str = "nms", iou: float = 0.5) -> np.ndarray:
    """Boxes [N, 6] (any number of slices' boxes, in image pixels) merged class by class; the kept boxes by
    descending score. Rows under the threshold (class -1) are dropped."""
    if method not in BOX_MERGES:
        raise ValueError(f"unknown box merge '{method}'; use {' or '.join(BOX_MERGES)}")
    boxes = kept(rows)
    boxes = boxes[np.argsort(-boxes[:, 4], kind="stable")]
    out = []
    for cls in np.unique(boxes[:, 5]):
        group = boxes[boxes[:, 5] == cls]
        overlaps = iou_matrix(group, group)
        alive = np.ones(len(group), dtype=bool)
        for i in range(len(group)):
            if not alive[i]:
                continue
            absorbed = alive & (overlaps[i] >= iou)
            absorbed[i] = False
            box = group[i].copy()
            if method == "greedy" and absorbed.any():
                members = group[absorbed | (np.arange(len(group)) == i)]
                box[:2] = members[:, :2].min(axis=0)
                box[2:4] = members[:, 2:4].max(axis=0)
            alive &= ~absorbed
            out.append(box)
    if not out:
        return np.zeros((0, COLUMNS))
    merged = np.stack(out)
    return merged[np.argsort(-merged[:, 4], kind="stable")]


def merge_slices(
    slices: list[tuple[Tile | None, np.ndarray, np.ndarray]], spec: BoxSpec, method: str = "nms", iou: float = 0.5
) -> np.ndarray:
    """One image's detections [N, 6] (x1, y1, x2, y2 in the image's pixels, score, class) from its slices' (tile, boxes
    [Q, 4], scores [Q, C] or [Q]): each slice's boxes read in its own pixels (normalised formats scaled by the slice's
    size), shifted by its offset, then merged (`merge_boxes`). One slice goes through the same merge, so a whole pass
    and a sliced one are judged alike. A tile of None: a whole input that is no image, its boxes in their own units."""
    rows = []
    for tile, boxes, scores in slices:
        h, w = (tile.rows.length, tile.cols.length) if tile is not None else (1, 1)
        found = detections(boxes[None], scores[None], spec, h, w)[0]
        rows.append(shift(found, tile.rows.start, tile.cols.start) if tile is not None else found)
    return merge_boxes(np.concatenate(rows) if rows else np.zeros((0, COLUMNS)), method, iou).astype(np.float32)
