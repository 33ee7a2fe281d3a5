"""Scale methods on streamed histograms: entropy (TensorRT's KL search), percentile, minmax. Pure numpy.

Histograms are TensorRT-style: 2048 bins over [0, range] of |x|. When a batch exceeds the range, the
range doubles (as often as needed) and pairs of bins are merged, which re-bins exactly: no count moves
to a wrong bin, and memory stays at 2048 counts per tensor whatever the number of samples.

Written by hand because no maintained library exposes these on a streamed histogram: ORT's calibrators
keep every activation in memory (the reason for this module), pytorch-quantization is torch-bound and
deprecated, and ModelOpt's are torch-bound too.
"""

from __future__ import annotations

import numpy as np

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128


class StreamingHistogram:
    """|x| histogram with a fixed bin count over a range that only grows (by doubling)."""

    def __init__(self, num_bins: int = NUM_BINS):
        if num_bins % 2:
            raise ValueError("num_bins must be even so that bins can be merged in pairs")
        self.num_bins = num_bins
        self.counts = np.zeros(num_bins, dtype=np.int64)
        self.range = 0.0
        self.amax = 0.0

    @property
    def bin_width(self) -> float:
        return self.range / self.num_bins

    def update(self, values: np.ndarray) -> None:
        data = np.abs(np.asarray(values, dtype=np.float32)).ravel()
        data = data[np.isfinite(data)]
        if data.size == 0:
            return
        peak = float(data.max())
        self.amax = max(self.amax, peak)
        if self.range == 0.0:
            self.range = peak if peak > 0 else 1e-8
        while peak > self.range:
            merged = self.counts.reshape(-1, 2).sum(axis=1)
            self.counts = np.concatenate([merged, np.zeros(self.num_bins // 2, dtype=np.int64)])
            self.range *= 2.0
        idx = np.minimum((data / self.range * self.num_bins).astype(np.int64), self.num_bins - 1)
        self.counts += np.bincount(idx, minlength=self.num_bins)


def minmax_amax(hist: StreamingHistogram) -> float:
    return hist.amax


def percentile_amax(hist: StreamingHistogram, percentile: float = 99.99) -> float:
    """Upper edge of the bin where the cumulative count reaches `percentile` %."""
    total = hist.counts.sum()
    if total == 0:
        return 0.0
    cdf = np.cumsum(hist.counts) / total
    index = int(np.searchsorted(cdf, percentile / 100.0))
    return min((index + 1) * hist.bin_width, hist.amax) if hist.amax else (index + 1) * hist.bin_width


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """Move a little mass onto zero bins so KL is finite (as TensorRT's reference does)."""
    zeros = p == 0
    n_zero, n_nonzero = int(zeros.sum()), int((~zeros).sum())
    if n_nonzero == 0:
        return None
    eps1 = eps * n_zero / n_nonzero
    if eps1 >= 1.0:
        return None
    out = p.astype(np.float64).copy()
    out[zeros] = eps
    out[~zeros] -= eps1
    return out


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum()
    return float(np.sum(p * np.log(p / q)))


def entropy_amax(hist: StreamingHistogram, num_quantized_bins: int = NUM_QUANTIZED_BINS, stride: int = 1) -> float:
    """TensorRT's entropy calibration: the clip threshold whose 128-level quantization loses the least
    information (KL divergence between the clipped reference and its quantized expansion).

    For each candidate i in [128, num_bins]: P = counts[:i] with the clipped tail added to P[i-1];
    Q = counts[:i] merged into 128 groups of i // 128 bins (the last takes the rest), each group's sum
    spread evenly over its non-empty bins; both smoothed (eps 1e-4) so that KL stays finite.
    The threshold is the upper edge of bin i with the smallest KL(P || Q).
    """
    counts = hist.counts.astype(np.float64)
    if counts.sum() == 0:
        return 0.0
    nbins = len(counts)
    tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # tail[i] = sum(counts[i:])
    best_i, best_kl = nbins, np.inf
    for i in range(num_quantized_bins, nbins + 1, stride):
        reference = counts[:i].copy()
        reference[i - 1] += tail[i]
        sliced = counts[:i]
        nonzero = sliced != 0
        # 128 groups of i // 128 bins each, the last group taking the remainder (the published algorithm).
        merged = i // num_quantized_bins
        edges = np.arange(num_quantized_bins + 1) * merged
        edges[-1] = i
        group_sum = np.add.reduceat(sliced, edges[:-1])
        group_nonzero = np.add.reduceat(nonzero.astype(np.float64), edges[:-1])
        group_of_bin = np.repeat(np.arange(num_quantized_bins), np.diff(edges))
        per_bin = np.divide(group_sum, group_nonzero, out=np.zeros_like(group_sum), where=group_nonzero > 0)
        expanded = np.where(nonzero, per_bin[group_of_bin], 0.0)
        p, q = _smooth(reference), _smooth(expanded)
        if p is None or q is None:
            continue
        kl = _kl(p, q)
        if kl < best_kl:
            best_kl, best_i = kl, i
    return (best_i) * hist.bin_width if best_i < nbins else hist.amax


def compute_amax(hist: StreamingHistogram, method: str, percentile: float = 99.99) -> float:
    if method == "entropy":
        return entropy_amax(hist)
    if method == "percentile":
        return percentile_amax(hist, percentile)
    if method == "minmax":
        return minmax_amax(hist)
    raise ValueError(f"unknown calibration method {method!r}")
