"""Accuracy metrics between a reference and a candidate array. Pure numpy, computed in float64.

rel-L2 is ||a - b|| / ||a|| over the whole tensor; cosine is computed over the whole tensor too, and
`rowwise_cosine` per vector along the last axis, whose minimum exposes one broken position among many
good ones.

No metric hides a bad value: NaN or Inf anywhere gives NaN, and a relative metric divides by the
reference's own norm, never by an absolute floor (a floor of 1e-12 made outputs around 1e-25 look
exact). A zero reference gives NaN too; `guards.reference_problem` says why such a reference cannot
be measured against before any metric is read.
"""

from __future__ import annotations

import numpy as np


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _ratio(num: float, den: float) -> float:
    """num / den, NaN when den is 0 or either is not finite (an undefined ratio is never a pass)."""
    if not (np.isfinite(num) and np.isfinite(den)) or den == 0.0:
        return float("nan")
    return float(num / den)


def rel_l2(reference: np.ndarray, candidate: np.ndarray) -> float:
    ref = _f64(reference)
    return _ratio(float(np.linalg.norm(ref - _f64(candidate))), float(np.linalg.norm(ref)))


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Cosine of the flattened arrays: 1 when both are all zeros (equal), 0 when only one is, NaN with NaN/Inf."""
    a, b = _f64(reference).ravel(), _f64(candidate).ravel()
    return float(_cosines(np.dot(a, b), np.linalg.norm(a), np.linalg.norm(b)))


def _cosines(dot, norm_a, norm_b):
    """Cosine from its parts, elementwise: a zero vector equals only a zero vector (1 or 0, not a division by a
    floor), and anything non-finite gives NaN."""
    dot, norm_a, norm_b = np.asarray(dot, dtype=np.float64), np.asarray(norm_a, dtype=np.float64), np.asarray(norm_b, dtype=np.float64)
    denom = norm_a * norm_b
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(denom > 0, dot / np.where(denom > 0, denom, 1.0), np.where((norm_a == 0) & (norm_b == 0), 1.0, 0.0))
    return np.where(np.isfinite(dot) & np.isfinite(denom), out, np.nan)


def _as_rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def rowwise_cosine(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Cosine per vector along the last axis (rules of `cosine` per row)."""
    a, b = _as_rows(_f64(reference)), _as_rows(_f64(candidate))
    with np.errstate(invalid="ignore", over="ignore"):
        return _cosines(np.sum(a * b, axis=1), np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1))


def max_abs(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Largest absolute difference; NaN when any element is NaN or Inf (np.max propagates NaN)."""
    diff = np.abs(_f64(reference) - _f64(candidate))
    return float(diff.max()) if diff.size else 0.0


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Share of rows (all axes but the last) whose argmax over the last axis agrees; NaN with a non-finite value."""
    ref, cand = np.asarray(reference), np.asarray(candidate)
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(cand))):
        return float("nan")
    if ref.ndim == 0 or ref.shape[-1] < 2:
        return 1.0
    return float(np.mean(ref.argmax(axis=-1) == cand.argmax(axis=-1)))


def worst_of(values: list[float], bound: str) -> float:
    """The worst value for a gate: NaN if any is NaN (NaN is never better than a number), else max for an
    upper bound ('max') and min for a lower one ('min'). Python's max/min skip NaN unless it comes first."""
    if any(v != v for v in values):
        return float("nan")
    return max(values) if bound == "max" else min(values)
