"""Detections from a detector's outputs, and how two sets of them agree. Pure numpy.

A `boxes` output holds one box per query ([B, Q, 4], in its declared format) and names the output that holds its
class logits or scores ([B, Q, C] or [B, Q]). `detections` turns the pair into rows (x1, y1, x2, y2, score, class)
with the queries under the score threshold marked by class -1 (the rows stay rectangular across a batch).

Two sets of detections are compared by matching: greedily, highest reference score first, each reference box takes the
unmatched candidate box of the same class with the highest IoU, if that IoU is at least `MATCH_IOU` (COCO's AP50
criterion). Greedy rather than Hungarian: at a 0.5 threshold a box overlaps at most a few others of its class, where
both give the same pairs in practice, and greedy is what detection evaluators (COCO's) do. From the pairs:
- recall: matched reference boxes / reference boxes; precision: matched candidate boxes / candidate boxes;
- matched IoU: the mean IoU of the pairs; score error: the mean |score difference| of the pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

BOX_FORMATS = ("cxcywh_norm", "xyxy_norm", "xyxy_px", "xywh_px")
ACTIVATIONS = ("softmax", "sigmoid", "none")
MATCH_IOU = 0.5
COLUMNS = 6  # x1, y1, x2, y2, score, class


@dataclass(frozen=True)
class BoxSpec:
    """How a boxes output reads: its format, the output with its class logits or scores, how they become scores
    (softmax over classes, sigmoid per class, or none: already scores), whether the last class is 'no object' (DETR),
    and the score a box needs to count."""

    format: str
    scores: str
    activation: str = "softmax"
    no_object: bool = False
    score_threshold: float = 0.5

    @property
    def normalized(self) -> bool:
        return self.format.endswith("_norm")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "scores": self.scores,
            "activation": self.activation,
            "no_object": self.no_object,
            "score_threshold": self.score_threshold,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BoxSpec":
        return cls(
            str(data["format"]),
            str(data["scores"]),
            str(data.get("activation", "softmax")),
            bool(data.get("no_object", False)),
            float(data.get("score_threshold", 0.5)),
        )


def to_xyxy(boxes: np.ndarray, fmt: str, height: float = 1.0, width: float = 1.0) -> np.ndarray:
    """Boxes [..., 4] in `fmt` as (x1, y1, x2, y2); normalised formats are scaled to pixels by (width, height)."""
    b = np.asarray(boxes, dtype=np.float64)
    if fmt == "cxcywh_norm":
        cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        out = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    elif fmt in ("xyxy_norm", "xyxy_px"):
        out = b.copy()
    elif fmt == "xywh_px":
        out = np.concatenate([b[..., :2], b[..., :2] + b[..., 2:4]], axis=-1)
    else:
        raise ValueError(f"unknown box format '{fmt}'; use one of {', '.join(BOX_FORMATS)}")
    if fmt.endswith("_norm"):
        out = out * np.array([width, height, width, height], dtype=np.float64)
    return out


def scores_and_classes(values: np.ndarray, spec: BoxSpec) -> tuple[np.ndarray, np.ndarray]:
    """Each query's best score and its class from [..., Q, C] logits (or [..., Q] scores: class 0)."""
    v = np.asarray(values, dtype=np.float64)
    if spec.activation == "sigmoid":
        with np.errstate(over="ignore"):
            v = 1.0 / (1.0 + np.exp(-v))
    elif spec.activation == "softmax" and v.ndim >= 1:
        with np.errstate(invalid="ignore", over="ignore"):
            e = np.exp(v - v.max(axis=-1, keepdims=True))
            v = e / e.sum(axis=-1, keepdims=True)
    if spec.no_object:
        v = v[..., :-1]
    return v.max(axis=-1), v.argmax(axis=-1).astype(np.float64)


def detections(boxes: np.ndarray, scores: np.ndarray, spec: BoxSpec, height: float = 1.0, width: float = 1.0) -> np.ndarray:
    """Rows (x1, y1, x2, y2, score, class) [B, Q, 6] from a batch's boxes [B, Q, 4] and class logits [B, Q, C] (or
    scores [B, Q]); a query under the threshold gets class -1. A NaN score keeps its row (so the NaN is seen)."""
    if np.ndim(scores) == np.ndim(boxes) - 1:  # one score per query: one class; a softmax over one value is none
        activation = "sigmoid" if spec.activation == "sigmoid" else "none"
        score, _ = scores_and_classes(np.asarray(scores)[..., None], BoxSpec(spec.format, spec.scores, activation))
        cls = np.zeros_like(score)
    else:
        score, cls = scores_and_classes(scores, spec)
    kept = ~(score < spec.score_threshold)
    cls = np.where(kept, cls, -1.0)
    return np.concatenate([to_xyxy(boxes, spec.format, height, width), score[..., None], cls[..., None]], axis=-1)


def kept(rows: np.ndarray) -> np.ndarray:
    """The rows of one image's detections [N, 6] that are boxes (class >= 0)."""
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, COLUMNS)
    return rows[rows[:, 5] >= 0]


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of a [N, 4+] with every box of b [M, 4+] (x1, y1, x2, y2); a box of zero area has IoU 0."""
    a, b = np.asarray(a, dtype=np.float64)[:, :4], np.asarray(b, dtype=np.float64)[:, :4]
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def match(reference: np.ndarray, candidate: np.ndarray, min_iou: float = MATCH_IOU) -> list[tuple[int, int, float]]:
    """Greedy same-class matching of one image's boxes [N, 6] and [M, 6]: (reference row, candidate row, IoU) pairs,
    reference boxes taken by descending score, each pairing with its best unmatched candidate at IoU >= min_iou."""
    if not len(reference) or not len(candidate):
        return []
    ious = iou_matrix(reference, candidate)
    ious[reference[:, None, 5] != candidate[None, :, 5]] = -1.0
    taken = np.zeros(len(candidate), dtype=bool)
    pairs = []
    for r in np.argsort(-reference[:, 4], kind="stable"):
        row = np.where(taken, -1.0, ious[r])
        c = int(row.argmax())
        if row[c] >= min_iou:
            taken[c] = True
            pairs.append((int(r), c, float(row[c])))
    return pairs


@dataclass
class ImageAgreement:
    """How one image's candidate boxes agree with its reference boxes."""

    reference_boxes: int
    candidate_boxes: int
    matched: int
    iou_sum: float
    score_error_sum: float

    def to_json(self) -> dict[str, Any]:
        return {
            "reference_boxes": self.reference_boxes,
            "candidate_boxes": self.candidate_boxes,
            "matched": self.matched,
            **box_metrics(self.reference_boxes, self.candidate_boxes, self.matched, self.iou_sum, self.score_error_sum),
        }


def agreement(reference: np.ndarray, candidate: np.ndarray, min_iou: float = MATCH_IOU) -> ImageAgreement:
    """One image's detections (rows [N, 6], class -1 rows ignored) matched and summed."""
    ref, cand = kept(reference), kept(candidate)
    pairs = match(ref, cand, min_iou)
    return ImageAgreement(
        len(ref),
        len(cand),
        len(pairs),
        float(sum(iou for _, _, iou in pairs)),
        float(sum(abs(ref[r, 4] - cand[c, 4]) for r, c, _ in pairs)),
    )


def box_metrics(reference_boxes: int, candidate_boxes: int, matched: int, iou_sum: float, score_error_sum: float) -> dict[str, float]:
    """recall, precision, matched IoU and score error from counts and sums. No boxes on either side agree fully (1.0);
    boxes on one side only agree not at all; with no pair, matched IoU is 0 and the score error NaN (nothing to measure)."""
    recall = matched / reference_boxes if reference_boxes else (1.0 if not candidate_boxes else 0.0)
    precision = matched / candidate_boxes if candidate_boxes else (1.0 if not reference_boxes else 0.0)
    if matched:
        iou, score = iou_sum / matched, score_error_sum / matched
    else:
        iou, score = (1.0, 0.0) if not (reference_boxes or candidate_boxes) else (0.0, float("nan"))
    return {"box_recall": recall, "box_precision": precision, "matched_iou": iou, "score_error": score}
