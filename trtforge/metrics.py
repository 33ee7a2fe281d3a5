"""Accuracy metrics between a reference and a candidate output. Pure numpy.

rel-L2 is ||a - b|| / ||a|| over the whole tensor; cosine is computed over the whole tensor too, and
`rowwise_cosine` per vector along the last axis (per token or per embedding), whose minimum is what
exposes one broken position among many good ones.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-12


def rel_l2(reference: np.ndarray, candidate: np.ndarray) -> float:
    ref = np.asarray(reference, dtype=np.float64)
    diff = ref - np.asarray(candidate, dtype=np.float64)
    return float(np.linalg.norm(diff) / max(np.linalg.norm(ref), _EPS))


def cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    a = np.asarray(reference, dtype=np.float64).ravel()
    b = np.asarray(candidate, dtype=np.float64).ravel()
    denom = max(np.linalg.norm(a) * np.linalg.norm(b), _EPS)
    return float(np.dot(a, b) / denom)


def rowwise_cosine(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    a = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
    b = b.reshape(-1, b.shape[-1]) if b.ndim else b.reshape(1, 1)
    denom = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), _EPS)
    return np.sum(a * b, axis=1) / denom


def max_abs(reference: np.ndarray, candidate: np.ndarray) -> float:
    diff = np.abs(np.asarray(reference, dtype=np.float64) - np.asarray(candidate, dtype=np.float64))
    return float(diff.max()) if diff.size else 0.0


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Share of rows (all axes but the last) whose argmax over the last axis agrees."""
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    if ref.ndim == 0 or ref.shape[-1] < 2:
        return 1.0
    return float(np.mean(ref.argmax(axis=-1) == cand.argmax(axis=-1)))


def compare(reference: np.ndarray, candidate: np.ndarray, logits: bool = False) -> dict[str, float]:
    if np.shape(reference) != np.shape(candidate):
        raise ValueError(f"shape mismatch: reference {np.shape(reference)} vs candidate {np.shape(candidate)}")
    out = {
        "rel_l2": rel_l2(reference, candidate),
        "cosine": cosine(reference, candidate),
        "min_row_cosine": float(rowwise_cosine(reference, candidate).min()) if np.size(reference) else 1.0,
        "max_abs": max_abs(reference, candidate),
    }
    if logits:
        out["top1_agreement"] = top1_agreement(reference, candidate)
    return out


def vectors(a: np.ndarray) -> np.ndarray:
    """The vectors compared row by row: each pixel's channels for NCHW outputs, else the last axis."""
    if a.ndim == 4:
        return a.transpose(0, 2, 3, 1).reshape(-1, a.shape[1])
    return a.reshape(-1, a.shape[-1] if a.ndim else 1)
