"""What makes a comparison prove nothing, judged before any metric is read.

A reference that is NaN/Inf, all zeros, constant, or too small to measure against cannot tell a right
candidate from a wrong one, so a check against it is an error (exit 2), never a pass. A candidate with
NaN/Inf fails its check (exit 1), naming the output, whatever the metrics say.

- "constant" is judged relative to the output's own magnitude, not to an absolute threshold: a
  random-init SegFormer's logits have std ~3e-3, which is small but very much not constant. An output is
  constant when its spread (max - min) is below `RELATIVE_SPREAD` times its largest magnitude. A single
  element cannot be judged constant (a scalar always is) unless it is exactly zero.
- "too small to measure": a reference whose largest magnitude is below `SMALLEST_MEASURABLE`, the square
  root of float32's smallest normal number. The products of two such values (the terms of every dot
  product, norm and variance: cosine, rel-L2, LayerNorm, attention scores) underflow float32, so a
  runtime loses them and no error measured against them means anything. A random-init MobileViT's logits
  (~1e-41) are far below it; activations that vanish layer by layer are the usual cause.

Statistics accumulate over batches (`ValueStats.add`), so a long run is judged on everything it saw, not
batch by batch (one blank image in a batch is not a constant output).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtforge.core.errors import UserError

RELATIVE_SPREAD = 1e-6
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
SMALLEST_MEASURABLE = float(np.sqrt(SMALLEST_NORMAL))


NO_BOXES = "empty (no box above its score threshold in any image)"  # a boxes output's reference (verify/compare.py)


class ReferenceUnusable(UserError):
    """The reference output cannot be measured against (NaN/Inf, zeros, constant, too small). Exit 2."""


@dataclass
class ValueStats:
    """Running facts about one output's values: how many, how many NaN/Inf, the finite range and magnitude."""

    count: int = 0
    nonfinite: int = 0
    low: float = float("inf")
    high: float = float("-inf")
    magnitude: float = 0.0

    @classmethod
    def of(cls, values: np.ndarray) -> "ValueStats":
        stats = cls()
        stats.add(values)
        return stats

    def add(self, values: np.ndarray) -> None:
        array = np.asarray(values)
        if array.dtype == bool:
            array = array.astype(np.int8)
        array = array.astype(np.float64, copy=False)
        finite = np.isfinite(array)
        self.count += int(array.size)
        self.nonfinite += int(array.size - np.count_nonzero(finite))
        if finite.any():
            kept = array[finite] if not finite.all() else array
            self.low = min(self.low, float(kept.min()))
            self.high = max(self.high, float(kept.max()))
            self.magnitude = max(self.magnitude, float(np.abs(kept).max()))

    def merge(self, other: "ValueStats") -> None:
        self.count += other.count
        self.nonfinite += other.nonfinite
        self.low = min(self.low, other.low)
        self.high = max(self.high, other.high)
        self.magnitude = max(self.magnitude, other.magnitude)

    def nonfinite_text(self) -> str:
        return f"{self.nonfinite} of {self.count} values are NaN or Inf"


def reference_problem(stats: ValueStats) -> str | None:
    """Why a check against values with these statistics could not fail, or None when it can."""
    if stats.count == 0:
        return None
    if stats.nonfinite:
        return stats.nonfinite_text()
    if stats.magnitude == 0.0:
        return "all zeros"
    if stats.magnitude < SMALLEST_MEASURABLE:
        return (
            f"too small to measure against (largest magnitude {stats.magnitude:.2g}, below {SMALLEST_MEASURABLE:.2g}, "
            "where float32 products underflow)"
        )
    if stats.count > 1 and stats.high - stats.low <= RELATIVE_SPREAD * stats.magnitude:
        return f"constant (every value {stats.low:.6g})"
    return None


def vacuous_reason(values: np.ndarray) -> str | None:
    """`reference_problem` of one array."""
    return reference_problem(ValueStats.of(values))


def unusable_reference(name: str, reason: str, where: str) -> ReferenceUnusable:
    """The one sentence for a reference output that proves nothing, with what to do about it."""
    if reason.startswith("too small"):
        advice = (
            "the model's activations vanish layer by layer; initialise the weights at a larger scale (e.g. the "
            "config's initializer_range) or load trained weights"
        )
    elif reason == NO_BOXES:
        advice = (
            "lower the boxes output's score_threshold in the config and re-export, or give inputs with objects where the "
            "check looks (a sliced run's whole pass sees the top-left crop the model takes whole)"
        )
    elif "NaN" in reason:
        advice = "the reference model itself computes NaN/Inf there; fix the model (or its inputs) before checking a target"
    else:
        advice = (
            "re-initialise the layer that produces it (e.g. a zero-initialised classifier head: "
            "torch.nn.init.normal_(head.weight, std=0.02)) or return a meaningful output"
        )
    return ReferenceUnusable(f"{where}: reference output '{name}' is {reason}, so comparing against it proves nothing; {advice}.")


def require_informative(outputs: dict[str, np.ndarray], where: str) -> None:
    """Raise ReferenceUnusable naming the first output whose reference values make the check vacuous."""
    for name, values in outputs.items():
        reason = vacuous_reason(values)
        if reason:
            raise unusable_reference(name, reason, where)


def require_informative_batches(batches: list[dict[str, np.ndarray]], where: str) -> None:
    """`require_informative` judged over every batch together (one blank sample is not a constant output)."""
    stats: dict[str, ValueStats] = {}
    for batch in batches:
        for name, values in batch.items():
            stats.setdefault(name, ValueStats()).add(values)
    for name, s in stats.items():
        reason = reference_problem(s)
        if reason:
            raise unusable_reference(name, reason, where)
