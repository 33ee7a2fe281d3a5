"""Per-output tolerances in Polygraphy's terms, and the error statistics they are checked on. Pure numpy.

A tolerance is an absolute (`atol`) and a relative (`rtol`) bound on one error statistic:
- `elemwise` (Polygraphy's default): every element satisfies |c - r| <= atol + rtol * |r|;
- `max`, `mean`, `median` or a quantile `qNN` (`q99`, `q99.9`): the statistic of the absolute error is
  <= atol, or the statistic of the relative error |c - r| / |r| is <= rtol.
A relative error where the reference is 0 is 0 when the candidate is 0 too, else infinite.

Statistics other than max and mean come from a histogram with 64 logarithmic bins per decade (bins 3.7%
wide), read at the upper edge of the bin that holds the quantile: it never reports less error than there is.
Outputs can be far larger than memory allows to keep, and a run adds them batch by batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trtforge.core.errors import UserError

BINS_PER_DECADE = 64
LOWEST_DECADE, HIGHEST_DECADE = -45, 40
_NBINS = (HIGHEST_DECADE - LOWEST_DECADE) * BINS_PER_DECADE
STATISTICS = ("elemwise", "max", "mean", "median")
_QUANTILE = re.compile(r"^q(\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Tolerance:
    atol: float = 0.0
    rtol: float = 0.0
    statistic: str = "elemwise"

    def describe(self) -> str:
        return f"atol {self.atol:g}, rtol {self.rtol:g} on the {self.statistic} error"


def quantile_of(statistic: str) -> float | None:
    """0.99 for 'q99', 0.5 for 'median', None for the statistics that are not quantiles."""
    if statistic == "median":
        return 0.5
    match = _QUANTILE.match(statistic)
    return float(match.group(1)) / 100.0 if match else None


def check_statistic(statistic: str, flag: str = "--error-stat") -> str:
    q = quantile_of(statistic)
    if statistic in STATISTICS or (q is not None and 0.0 < q < 1.0):
        return statistic
    raise UserError(
        f"{flag} '{statistic}' is not one of elemwise, max, mean, median or a quantile qNN with 0 < NN < 100 (e.g. q99); pick one of them."
    )


def parse_tolerances(values: list[str], flag: str) -> dict[str | None, float]:
    """'NAME:VALUE' or 'VALUE' (every output) -> {name or None: value}; a value must be a finite number >= 0."""
    out: dict[str | None, float] = {}
    for text in values:
        name, sep, number = text.rpartition(":")
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
        if not np.isfinite(value) or value < 0:
            raise UserError(f"{flag} '{text}' is not NAME:VALUE or VALUE with a finite VALUE >= 0; e.g. {flag} logits:1e-3.")
        out[name if sep else None] = value
    return out


def tolerances_for(
    outputs: list[str], atol: dict[str | None, float], rtol: dict[str | None, float], statistic: str
) -> dict[str, Tolerance]:
    """One Tolerance per output named by either table (or every output, for a bare VALUE); names must exist."""
    for flag, table in (("--atol", atol), ("--rtol", rtol)):
        unknown = [n for n in table if n is not None and n not in outputs]
        if unknown:
            raise UserError(f"{flag} names output '{unknown[0]}', which the model does not have (outputs: {', '.join(outputs)}).")
    if not atol and not rtol:
        return {}
    out = {}
    for name in outputs:
        a, r = atol.get(name, atol.get(None)), rtol.get(name, rtol.get(None))
        if a is not None or r is not None:
            out[name] = Tolerance(a or 0.0, r or 0.0, statistic)
    return out


class ErrorHistogram:
    """Exact count, sum and max of non-negative errors, and a log histogram for their quantiles."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.largest = 0.0
        self.zeros = 0
        self.infinite = 0
        self.bins = np.zeros(_NBINS, dtype=np.int64)

    def add(self, errors: np.ndarray) -> None:
        e = np.asarray(errors, dtype=np.float64).ravel()
        if not e.size:
            return
        self.count += int(e.size)
        self.largest = max(self.largest, float(e.max())) if not np.isnan(e).any() else float("nan")
        self.total += float(e.sum())
        positive = e[(e > 0) & np.isfinite(e)]
        self.zeros += int(np.count_nonzero(e == 0))
        self.infinite += int(e.size - positive.size - np.count_nonzero(e == 0))
        if positive.size:
            idx = np.floor((np.log10(positive) - LOWEST_DECADE) * BINS_PER_DECADE).astype(np.int64)
            self.bins += np.bincount(np.clip(idx, 0, _NBINS - 1), minlength=_NBINS)

    def merge(self, other: "ErrorHistogram") -> None:
        self.count += other.count
        self.total += other.total
        self.largest = max(self.largest, other.largest) if self.largest == self.largest and other.largest == other.largest else float("nan")
        self.zeros += other.zeros
        self.infinite += other.infinite
        self.bins += other.bins

    def statistic(self, name: str) -> float:
        if not self.count:
            return 0.0
        if name in ("max", "elemwise"):
            return self.largest
        if name == "mean":
            return self.total / self.count
        q = quantile_of(name)
        assert q is not None, name
        rank = int(np.ceil(q * (self.count - 1))) + 1  # numpy's 'higher' quantile: the rank-th smallest, 1-based
        if rank <= self.zeros:
            return 0.0
        cumulative = self.zeros + np.cumsum(self.bins)
        i = int(np.searchsorted(cumulative, rank))
        if i >= _NBINS:
            return float("inf")
        return float(10.0 ** (LOWEST_DECADE + (i + 1) / BINS_PER_DECADE))


def relative_errors(reference: np.ndarray, absolute: np.ndarray) -> np.ndarray:
    magnitude = np.abs(reference)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = absolute / magnitude
    rel[magnitude == 0] = np.where(absolute[magnitude == 0] == 0, 0.0, np.inf)
    return rel


def elementwise_violations(reference: np.ndarray, absolute: np.ndarray, tolerance: Tolerance) -> int:
    """Elements outside atol + rtol * |reference| (NaN is outside every bound)."""
    return int(np.count_nonzero(~(absolute <= tolerance.atol + tolerance.rtol * np.abs(reference))))


def tolerance_passed(tolerance: Tolerance, absolute: ErrorHistogram, relative: ErrorHistogram, violations: int) -> bool:
    if tolerance.statistic == "elemwise":
        return violations == 0
    a, r = absolute.statistic(tolerance.statistic), relative.statistic(tolerance.statistic)
    return bool(a <= tolerance.atol or r <= tolerance.rtol)
