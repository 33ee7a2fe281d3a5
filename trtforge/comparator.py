"""One comparator for run, calibrate and the export/clean checks: metrics chosen by output kind. Pure.

Polygraphy's split: runners produce named outputs, a comparator judges them. Here the judge knows
what an output means (outputs.py):
- token  [B, S, H...]: rel-L2, cosine, min row cosine (per position), and the cosine of each
  sequence's mean-pooled vector (item cosine);
- pooled [B, H]: cosine per vector (item cosine), rel-L2;
- logits [B, C]: top-1 agreement, cosine per vector (item cosine), rel-L2;
- dense  [B, C, H, W]: per-pixel argmax agreement over the channel axis, rel-L2, cosine per image.
Every kind also reports rel_l2, cosine (whole tensor), min_row_cosine and max_abs; `item` is the unit
a user sees (a sequence, a vector, an image), so `min_item_cosine` is the worst of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtforge.metrics import max_abs, rowwise_cosine

_EPS = 1e-12
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
    vector itself for pooled/logits, the flattened image for dense."""
    a = np.asarray(a, dtype=np.float64)
    if kind == "token" and a.ndim >= 3:
        if mask is not None and mask.shape == a.shape[:2]:
            w = mask.astype(np.float64).reshape(mask.shape + (1,) * (a.ndim - 2))
            return ((a * w).sum(axis=1) / np.maximum(w.sum(axis=1), _EPS)).reshape(a.shape[0], -1)
        return a.mean(axis=1).reshape(a.shape[0], -1)
    return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)


@dataclass
class _Acc:
    """Running sums for one output, so batches of different shapes (sequence lengths) combine."""
    kind: str | None
    diff2: float = 0.0
    ref2: float = 0.0
    cand2: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0
    min_row: float = 1.0
    item_cos: list[float] = field(default_factory=list)
    agree: int = 0
    votes: int = 0

    def add(self, ref: np.ndarray, cand: np.ndarray, mask: np.ndarray | None = None) -> None:
        if np.shape(ref) != np.shape(cand):
            raise ValueError(f"shape mismatch: reference {np.shape(ref)} vs candidate {np.shape(cand)}")
        a, b = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
        self.diff2 += float(np.sum((a - b) ** 2))
        self.ref2 += float(np.sum(a * a))
        self.cand2 += float(np.sum(b * b))
        self.dot += float(np.sum(a * b))
        self.max_abs = max(self.max_abs, max_abs(a, b))
        if a.size:
            self.min_row = min(self.min_row, float(rowwise_cosine(rows(self.kind, a), rows(self.kind, b)).min()))
            self.item_cos += rowwise_cosine(items(self.kind, a, mask), items(self.kind, b, mask)).tolist()
        if self.kind == "logits":
            self.agree += int(np.sum(a.argmax(axis=-1) == b.argmax(axis=-1)))
            self.votes += int(np.prod(a.shape[:-1]))
        elif self.kind == "dense":
            self.agree += int(np.sum(a.argmax(axis=1) == b.argmax(axis=1)))
            self.votes += int(a.size // a.shape[1])

    def merge(self, other: "_Acc") -> None:
        """Add another accumulator's batches (a shard judged elsewhere). Merging per-item accumulators in
        item order gives the very sums that adding those items in that order gives."""
        self.diff2 += other.diff2
        self.ref2 += other.ref2
        self.cand2 += other.cand2
        self.dot += other.dot
        self.max_abs = max(self.max_abs, other.max_abs)
        self.min_row = min(self.min_row, other.min_row)
        self.item_cos += other.item_cos
        self.agree += other.agree
        self.votes += other.votes

    def metrics(self) -> dict[str, float]:
        out = {"rel_l2": float(np.sqrt(self.diff2) / max(np.sqrt(self.ref2), _EPS)),
               "cosine": float(self.dot / max(np.sqrt(self.ref2 * self.cand2), _EPS)),
               "min_row_cosine": self.min_row, "max_abs": self.max_abs,
               "min_item_cosine": float(min(self.item_cos)) if self.item_cos else 1.0,
               "mean_item_cosine": float(np.mean(self.item_cos)) if self.item_cos else 1.0,
               "items": len(self.item_cos)}
        if self.kind in TASK_METRIC:
            out[TASK_METRIC[self.kind]] = self.agree / self.votes if self.votes else 1.0
        return out


class Comparator:
    """Accumulates reference-vs-candidate metrics per output over any number of batches."""

    def __init__(self, kinds: dict[str, str | None]):
        self.kinds = kinds
        self._acc = {name: _Acc(kind) for name, kind in kinds.items()}

    def add(self, reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], mask: np.ndarray | None = None) -> None:
        for name, acc in self._acc.items():
            acc.add(reference[name], candidate[name], mask)

    def add_output(self, name: str, reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None = None) -> None:
        self._acc[name].add(reference, candidate, mask)

    def merge(self, other: "Comparator") -> None:
        for name, acc in other._acc.items():
            self._acc[name].merge(acc)

    def result(self) -> dict[str, dict[str, float]]:
        return {name: acc.metrics() for name, acc in self._acc.items() if acc.item_cos or acc.ref2}


def compare_outputs(kinds: dict[str, str | None], reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
                    mask: np.ndarray | None = None) -> dict[str, dict[str, float]]:
    """Metrics per output for one pair of output dicts; every output in `kinds` must be in both."""
    missing = [n for n in kinds if n not in candidate]
    if missing:
        raise ValueError(f"candidate lacks outputs {missing}")
    comparator = Comparator(kinds)
    comparator.add(reference, candidate, mask)
    return comparator.result()


def worst(per_output: dict[str, dict[str, float]]) -> dict[str, float]:
    """Worst case across outputs: the largest errors, the smallest agreements and cosines."""
    out: dict[str, float] = {}
    for metrics in per_output.values():
        for key, value in metrics.items():
            if key == "items":
                continue
            if key in ("rel_l2", "max_abs"):
                out[key] = max(out.get(key, value), value)
            else:
                out[key] = min(out.get(key, value), value)
    return out
