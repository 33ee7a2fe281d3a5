"""The one comparator: a target's outputs against a reference's, per output, by the output's kind. Pure.

Polygraphy's split: runners produce named outputs, a comparator judges them (gates.py decides pass or
fail). The comparator knows what an output means (outputs.py):
- token  [B, S, H...]: rel-L2, cosine, min row cosine (per position), and the cosine of each
  sequence's mean-pooled vector (item cosine);
- pooled [B, H]: cosine per vector (item cosine), rel-L2;
- logits [B, C]: top-1 agreement, cosine per vector (item cosine), rel-L2;
- dense  [B, C, H, W]: per-pixel argmax agreement over the channel axis, rel-L2, cosine per image;
- boxes  [B, Q, 4] with the class logits or scores of another output (box_scores): the detections above the score
  threshold matched by IoU (verify/boxes.py): box recall and precision, matched IoU and score error, per image and
  overall; the box_scores output itself is compared as numbers (rel-L2, cosine). Merged detections (a sliced run's
  rows (x1, y1, x2, y2, score, class), class -1 for none) are compared as they are (`add_output`).
Every kind also reports rel_l2, cosine (whole tensor), min_row_cosine and max_abs; `item` is the unit
a user sees (a sequence, a vector, an image), so `min_item_cosine` is the worst of them.

Besides the metrics, each output's result carries `candidate_nonfinite` (NaN/Inf values in the target:
the check fails) and `reference_problem` (why the reference proves nothing, guards.py). With a NaN/Inf
anywhere every metric is NaN: no number is reported for a comparison that did not happen. With
tolerances (tolerances.py), the absolute and relative error statistics and the tolerance verdict too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtforge.verify.boxes import BoxSpec, ImageAgreement, agreement, box_metrics, detections
from trtforge.verify.guards import NO_BOXES, ValueStats, reference_problem
from trtforge.verify.metrics import rowwise_cosine
from trtforge.verify.tolerances import (
    ErrorHistogram,
    Tolerance,
    elementwise_violations,
    relative_errors,
    tolerance_passed,
)

# Which task metric each kind adds, and the gate that reads it.
TASK_METRIC = {"logits": "top1_agreement", "dense": "pixel_agreement"}


def rows(kind: str | None, a: np.ndarray) -> np.ndarray:
    """The vectors compared row by row: channels per pixel for dense, else the last axis."""
    a = np.asarray(a)
    if kind == "dense" or (kind is None and a.ndim == 4):
        return np.moveaxis(a, 1, -1).reshape(-1, a.shape[1])
    return a.reshape(-1, a.shape[-1] if a.ndim else 1)


def items(kind: str | None, a: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """One vector per batch item: the (mask-weighted) mean over positions for token outputs, the
    vector itself for pooled/logits, the flattened image for dense. A row with no unmasked position
    pools to zeros (and compares equal only to zeros)."""
    a = np.asarray(a, dtype=np.float64)
    if kind == "token" and a.ndim >= 3:
        if mask is not None and mask.shape == a.shape[:2]:
            w = mask.astype(np.float64).reshape(mask.shape + (1,) * (a.ndim - 2))
            weight = w.sum(axis=1)
            return ((a * w).sum(axis=1) / np.where(weight > 0, weight, 1.0)).reshape(a.shape[0], -1)
        return a.mean(axis=1).reshape(a.shape[0], -1)
    return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)


def _lower(a: float, b: float) -> float:
    return float("nan") if a != a or b != b else min(a, b)


@dataclass
class _Output:
    """Running sums for one output, so batches of different shapes (sequence lengths) combine."""

    kind: str | None
    tolerance: Tolerance | None = None
    diff2: float = 0.0
    ref2: float = 0.0
    cand2: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0
    min_row: float = 1.0
    item_cos: list[float] = field(default_factory=list)
    agree: int = 0
    votes: int = 0
    reference: ValueStats = field(default_factory=ValueStats)
    candidate: ValueStats = field(default_factory=ValueStats)
    abs_err: ErrorHistogram | None = None
    rel_err: ErrorHistogram | None = None
    violations: int = 0

    def add(self, ref: np.ndarray, cand: np.ndarray, mask: np.ndarray | None = None) -> None:
        if np.shape(ref) != np.shape(cand):
            raise ValueError(f"shape mismatch: reference {np.shape(ref)} vs candidate {np.shape(cand)}")
        a, b = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
        self.reference.add(a)
        self.candidate.add(b)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a - b)
            self.diff2 += float(np.sum(diff * diff))
            self.ref2 += float(np.sum(a * a))
            self.cand2 += float(np.sum(b * b))
            self.dot += float(np.sum(a * b))
        if a.size:
            self.max_abs = max(self.max_abs, float(diff.max())) if not np.isnan(diff).any() else float("nan")
            self.min_row = _lower(self.min_row, float(rowwise_cosine(rows(self.kind, a), rows(self.kind, b)).min()))
            self.item_cos += rowwise_cosine(items(self.kind, a, mask), items(self.kind, b, mask)).tolist()
        if self.kind == "logits":
            self.agree += int(np.sum(a.argmax(axis=-1) == b.argmax(axis=-1)))
            self.votes += int(np.prod(a.shape[:-1]))
        elif self.kind == "dense":
            self.agree += int(np.sum(a.argmax(axis=1) == b.argmax(axis=1)))
            self.votes += int(a.size // a.shape[1])
        if self.tolerance is not None:
            if self.abs_err is None or self.rel_err is None:
                self.abs_err, self.rel_err = ErrorHistogram(), ErrorHistogram()
            self.abs_err.add(diff)
            self.rel_err.add(relative_errors(a, diff))
            self.violations += elementwise_violations(a, diff, self.tolerance)

    def merge(self, other: "_Output") -> None:
        """Add another accumulator's batches (a shard judged elsewhere). Merging per-item accumulators in
        item order gives the very sums that adding those items in that order gives."""
        self.diff2 += other.diff2
        self.ref2 += other.ref2
        self.cand2 += other.cand2
        self.dot += other.dot
        self.max_abs = max(self.max_abs, other.max_abs) if self.max_abs == self.max_abs and other.max_abs == other.max_abs else float("nan")
        self.min_row = _lower(self.min_row, other.min_row)
        self.item_cos += other.item_cos
        self.agree += other.agree
        self.votes += other.votes
        self.reference.merge(other.reference)
        self.candidate.merge(other.candidate)
        if other.abs_err is not None and other.rel_err is not None:
            if self.abs_err is None or self.rel_err is None:
                self.abs_err, self.rel_err = ErrorHistogram(), ErrorHistogram()
            self.abs_err.merge(other.abs_err)
            self.rel_err.merge(other.rel_err)
        self.violations += other.violations

    def metrics(self) -> dict[str, Any]:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # Inf in a reference: NaN, reported below
            return self._metrics()

    def _metrics(self) -> dict[str, Any]:
        item_cos = np.asarray(self.item_cos, dtype=np.float64)
        ref_norm = float(np.sqrt(self.ref2))
        out: dict[str, Any] = {
            "rel_l2": float(np.sqrt(self.diff2) / ref_norm) if ref_norm > 0 else float("nan"),
            "cosine": _whole_cosine(self.dot, self.ref2, self.cand2),
            "min_row_cosine": self.min_row,
            "max_abs": self.max_abs,
            "min_item_cosine": float(item_cos.min()) if item_cos.size else 1.0,
            "mean_item_cosine": float(item_cos.mean()) if item_cos.size else 1.0,
            "items": int(item_cos.size),
        }
        if self.kind in TASK_METRIC:
            out[TASK_METRIC[self.kind]] = self.agree / self.votes if self.votes else 1.0
        bad = self.candidate.nonfinite or self.reference.nonfinite
        if bad:
            out = {k: (v if k == "items" else float("nan")) for k, v in out.items()}
        out["candidate_nonfinite"] = self.candidate.nonfinite
        out["values"] = self.candidate.count
        out["reference_problem"] = reference_problem(self.reference)
        if self.tolerance is not None and self.abs_err is not None and self.rel_err is not None:
            stat = self.tolerance.statistic
            out["tolerance"] = {
                "atol": self.tolerance.atol,
                "rtol": self.tolerance.rtol,
                "statistic": stat,
                "abs_error": self.abs_err.statistic(stat),
                "rel_error": self.rel_err.statistic(stat),
                "violations": self.violations,
                "passed": (not bad) and tolerance_passed(self.tolerance, self.abs_err, self.rel_err, self.violations),
            }
        return out


def _whole_cosine(dot: float, ref2: float, cand2: float) -> float:
    if not (np.isfinite(dot) and np.isfinite(ref2) and np.isfinite(cand2)):
        return float("nan")
    if ref2 == 0 or cand2 == 0:
        return 1.0 if ref2 == cand2 else 0.0
    return float(dot / np.sqrt(ref2 * cand2))


@dataclass
class _Boxes:
    """Running counts for one boxes output: each image's detections matched (verify/boxes.py), kept per image."""

    kind: str = "boxes"
    images: list[ImageAgreement] = field(default_factory=list)
    reference: ValueStats = field(default_factory=ValueStats)
    candidate: ValueStats = field(default_factory=ValueStats)

    def add(self, ref: np.ndarray, cand: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Detections [B, N, 6] of each side (N may differ): one image per batch row."""
        ref, cand = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
        if len(ref) != len(cand):
            raise ValueError(f"image count mismatch: reference {len(ref)} vs candidate {len(cand)}")
        self.reference.add(ref)
        self.candidate.add(cand)
        for a, b in zip(ref, cand):
            self.images.append(agreement(a, b))

    def merge(self, other: "_Boxes") -> None:
        self.images += other.images
        self.reference.merge(other.reference)
        self.candidate.merge(other.candidate)

    def metrics(self) -> dict[str, Any]:
        ref_boxes = sum(i.reference_boxes for i in self.images)
        cand_boxes = sum(i.candidate_boxes for i in self.images)
        matched = sum(i.matched for i in self.images)
        out: dict[str, Any] = box_metrics(
            ref_boxes, cand_boxes, matched, sum(i.iou_sum for i in self.images), sum(i.score_error_sum for i in self.images)
        )
        bad = self.candidate.nonfinite or self.reference.nonfinite
        if bad:
            out = {k: float("nan") for k in out}
        per_image = [i.to_json() for i in self.images]
        out.update(
            reference_boxes=ref_boxes,
            candidate_boxes=cand_boxes,
            matched=matched,
            items=len(self.images),
            min_image_recall=float("nan") if bad else min((i["box_recall"] for i in per_image), default=1.0),
            per_image=per_image,
            candidate_nonfinite=self.candidate.nonfinite,
            values=self.candidate.count,
        )
        problem = reference_problem(self.reference) if self.reference.nonfinite else None
        if problem is None and self.images and not ref_boxes:
            problem = NO_BOXES
        out["reference_problem"] = problem
        return out


class Comparator:
    """Accumulates reference-vs-candidate metrics per output over any number of batches. `boxes`: the BoxSpec of each
    boxes output, by which `add` turns raw outputs into detections (a boxes output without one is compared as numbers)."""

    def __init__(
        self, kinds: dict[str, str | None], tolerances: dict[str, Tolerance] | None = None, boxes: dict[str, BoxSpec] | None = None
    ):
        self.kinds = kinds
        self.boxes = {n: b for n, b in (boxes or {}).items() if kinds.get(n) == "boxes"}
        self._outputs: dict[str, Any] = {
            name: _Boxes() if name in self.boxes else _Output(kind, (tolerances or {}).get(name)) for name, kind in kinds.items()
        }

    def add(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], mask: np.ndarray | None = None) -> None:
        missing = [n for n in self._outputs if n not in candidate or n not in reference]
        missing += [s.scores for s in self.boxes.values() if s.scores not in candidate or s.scores not in reference]
        if missing:
            side = "candidate" if missing[0] not in candidate else "reference"
            raise ValueError(f"the {side} lacks output '{missing[0]}'")
        for name, acc in self._outputs.items():
            spec = self.boxes.get(name) if isinstance(acc, _Boxes) else None
            if spec is not None:  # raw outputs of the same inputs: IoU does not change with the unit, so normalised stays
                acc.add(
                    detections(reference[name], reference[spec.scores], spec), detections(candidate[name], candidate[spec.scores], spec)
                )
            else:
                acc.add(reference[name], candidate[name], mask)

    def add_output(self, name: str, reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None = None) -> None:
        self._outputs[name].add(reference, candidate, mask)

    def merge(self, other: "Comparator") -> None:
        for name, acc in other._outputs.items():
            self._outputs[name].merge(acc)

    def result(self) -> dict[str, dict[str, Any]]:
        return {name: acc.metrics() for name, acc in self._outputs.items() if acc.candidate.count or getattr(acc, "images", None)}


def compare_outputs(
    kinds: dict[str, str | None],
    reference: dict[str, np.ndarray],
    candidate: dict[str, np.ndarray],
    mask: np.ndarray | None = None,
    tolerances: dict[str, Tolerance] | None = None,
) -> dict[str, dict[str, Any]]:
    """Metrics per output for one pair of output dicts; every output in `kinds` must be in both."""
    comparator = Comparator(kinds, tolerances)
    comparator.add(reference, candidate, mask)
    return comparator.result()


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, kind: str | None = None) -> dict[str, Any]:
    """The comparator's result for one pair of arrays."""
    return compare_outputs({"output": kind}, {"output": reference}, {"output": candidate})["output"]


BOX_KEYS = ("box_recall", "box_precision", "matched_iou", "score_error", "min_image_recall")
NUMERIC_KEYS = ("rel_l2", "cosine", "min_row_cosine", "max_abs", "min_item_cosine", "mean_item_cosine", *TASK_METRIC.values(), *BOX_KEYS)
LARGER_IS_WORSE = ("rel_l2", "max_abs", "score_error")


def worst(per_output: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Worst case across outputs: the largest errors, the smallest agreements and cosines; NaN wins."""
    out: dict[str, float] = {}
    for metrics in per_output.values():
        for key in NUMERIC_KEYS:
            if key not in metrics:
                continue
            value = metrics[key]
            if key not in out:
                out[key] = value
            elif value != value or out[key] != out[key]:
                out[key] = float("nan")
            else:
                out[key] = max(out[key], value) if key in LARGER_IS_WORSE else min(out[key], value)
    return out
