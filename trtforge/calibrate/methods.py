"""Scale methods on streamed histograms: entropy (TensorRT's KL search), percentile, minmax. Pure numpy.

Histograms are TensorRT-style: 2048 bins over [0, range) of |x|. The range is always a power of two,
the smallest one above the largest |x| seen: when a batch exceeds it, it doubles (as often as needed)
and pairs of bins are merged. With a power-of-two range, x * bins / range is exact in float64, so each
value's bin at the final range is floor(x * bins / range) however the values arrived: a histogram is a
function of the multiset of values alone. That makes merges exact and order-independent (shards of a
calibration set, collected on Ray actors, merge into the very histogram one process builds), and
memory stays at 2048 counts per tensor whatever the number of samples.

Written by hand because no maintained library exposes these on a streamed histogram: ORT's calibrators
keep every activation in memory (the reason for this module), pytorch-quantization is torch-bound and
deprecated, and ModelOpt's are torch-bound too.
"""

from __future__ import annotations

import math

import numpy as np

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128


def canonical_range(peak: float) -> float:
    """The smallest power of two strictly above `peak` (> 0): a range every shard agrees on."""
    return math.ldexp(1.0, math.frexp(peak)[1])


class StreamingHistogram:
    """|x| histogram with a fixed bin count over a power-of-two range that only grows (by doubling).
    range 0.0 means only zeros were seen (all in bin 0, which they stay in at any range)."""

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

    def _grow_to(self, new_range: float) -> None:
        """Re-bin to a larger power-of-two range by merging pairs of bins (exact, see the module doc)."""
        if self.range == 0.0:
            self.range = new_range  # only zeros so far: bin 0 at any range
            return
        while self.range < new_range:
            merged = self.counts.reshape(-1, 2).sum(axis=1)
            self.counts = np.concatenate([merged, np.zeros(self.num_bins // 2, dtype=np.int64)])
            self.range *= 2.0

    def update(self, values: np.ndarray) -> None:
        data = np.abs(np.asarray(values, dtype=np.float32)).ravel()
        data = data[np.isfinite(data)]
        if data.size == 0:
            return
        peak = float(data.max())
        self.amax = max(self.amax, peak)
        if peak == 0.0:
            self.counts[0] += data.size
            return
        if peak >= self.range:
            self._grow_to(canonical_range(peak))
        # float32 -> float64 is exact and num_bins / range is a power of two times an integer: no rounding.
        idx = np.minimum((data.astype(np.float64) * (self.num_bins / self.range)).astype(np.int64), self.num_bins - 1)
        self.counts += np.bincount(idx, minlength=self.num_bins)

    def merge(self, other: "StreamingHistogram") -> None:
        """Add another histogram of the same bin count: both brought to the larger range, then counts added."""
        if other.num_bins != self.num_bins:
            raise ValueError(f"cannot merge histograms of {self.num_bins} and {other.num_bins} bins")
        other = other.copy()
        wanted = max(self.range, other.range)
        if wanted > 0.0:
            self._grow_to(wanted)
            other._grow_to(wanted)
        self.counts = self.counts + other.counts
        self.amax = max(self.amax, other.amax)

    def copy(self) -> "StreamingHistogram":
        out = StreamingHistogram(self.num_bins)
        out.counts, out.range, out.amax = self.counts.copy(), self.range, self.amax
        return out


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


def quantized_groups(num_bins: int, num_quantized_bins: int = NUM_QUANTIZED_BINS) -> np.ndarray:
    """Group of each of the first `num_bins` bins when they are merged into `num_quantized_bins` levels.

    Bin j goes to group floor(j * levels / num_bins): group sizes differ by at most one, as in
    pytorch-quantization's `np.digitize(range(i), np.linspace(0, i, levels + 1)) - 1` (exact in integers,
    since i / 128 is exact in binary). The older "groups of i // 128, the last takes the remainder" left a
    last group up to twice as wide, so KL jumped every 128 candidates: a sawtooth in the thresholds.
    """
    return (np.arange(num_bins, dtype=np.int64) * num_quantized_bins) // num_bins


def entropy_amax(
    hist: StreamingHistogram, num_quantized_bins: int = NUM_QUANTIZED_BINS, stride: int = 1, start_bin: int = NUM_QUANTIZED_BINS
) -> float:
    """TensorRT's entropy calibration as NVIDIA's pytorch-quantization implements it (`_compute_amax_entropy`):
    the clip threshold whose 128-level quantization loses the least information.

    - The zero bin takes the count of its neighbour (`bins[0] = bins[1]`): after a ReLU half the mass
      sits in bin 0, which would otherwise dominate KL and pull the threshold far down (1.77 instead of
      4.12 on ReLU(N(0, 1)), whose max is 4.73).
    - For each candidate i: P = bins[:i] with the clipped tail added to P[i-1]; Q = bins[:i] merged into
      128 evenly distributed groups (`quantized_groups`), each group's sum spread over its non-empty bins.
    - KL(P || Q) as scipy.stats.entropy computes it (terms with P = 0 vanish; P > 0 where Q = 0 is +inf);
      the last minimum wins; the threshold is the upper edge of bin i, never above the observed max.
    """
    counts = hist.counts.astype(np.float64)
    if counts.sum() == 0:
        return 0.0
    counts[0] = counts[1]
    nbins = len(counts)
    tail = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # tail[i] = sum(counts[i:])
    best_i, best_kl = nbins, np.inf
    for i in range(start_bin, nbins + 1, stride):
        sliced = counts[:i]
        reference = sliced.copy()
        reference[i - 1] += tail[i]
        nonzero = sliced != 0
        group = quantized_groups(i, num_quantized_bins)
        group_sum = np.bincount(group, weights=sliced, minlength=num_quantized_bins)
        group_nonzero = np.bincount(group, weights=nonzero.astype(np.float64), minlength=num_quantized_bins)
        per_bin = np.divide(group_sum, group_nonzero, out=np.zeros_like(group_sum), where=group_nonzero > 0)
        expanded = np.where(nonzero, per_bin[group], 0.0)
        kl = _kl(reference, expanded)
        if kl <= best_kl:  # ties: the last (largest) candidate, as pytorch-quantization's last argmin
            best_kl, best_i = kl, i
    return min(best_i * hist.bin_width, hist.amax)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.stats.entropy(p, q) on unnormalised counts, without the scipy dependency."""
    p = p / p.sum()
    q_total = q.sum()
    if q_total == 0:
        return np.inf
    q = q / q_total
    mask = p > 0
    if np.any(q[mask] == 0):
        return np.inf
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def compute_amax(hist: StreamingHistogram, method: str, percentile: float = 99.99) -> float:
    if method == "entropy":
        return entropy_amax(hist)
    if method == "percentile":
        return percentile_amax(hist, percentile)
    if method == "minmax":
        return minmax_amax(hist)
    raise ValueError(f"unknown calibration method {method!r}")
