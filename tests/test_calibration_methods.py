import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.calibrate.methods import StreamingHistogram, entropy_amax, minmax_amax, percentile_amax


def reference_entropy_threshold(hist_counts, bin_width, num_quantized_bins=128):
    """Plain transcription of the published algorithm (GTC 2017 '8-bit Inference with TensorRT'),
    loops and all, with the eps smoothing of the reference implementations."""
    def smooth(p, eps=0.0001):
        is_zero = [x == 0 for x in p]
        n_zero = sum(is_zero)
        n_nonzero = len(p) - n_zero
        if n_nonzero == 0:
            return None
        eps1 = eps * n_zero / n_nonzero
        if eps1 >= 1.0:
            return None
        return [eps if z else x - eps1 for x, z in zip(p, is_zero)]

    def kl(p, q):
        sp, sq = sum(p), sum(q)
        return sum((a / sp) * np.log((a / sp) / (b / sq)) for a, b in zip(p, q))

    counts = [float(c) for c in hist_counts]
    n = len(counts)
    best, best_i = float("inf"), n
    for i in range(num_quantized_bins, n + 1):
        reference = counts[:i]
        reference[i - 1] += sum(counts[i:])
        sliced = counts[:i]
        merged = i // num_quantized_bins
        expanded = [0.0] * i
        for j in range(num_quantized_bins):
            start = j * merged
            stop = i if j == num_quantized_bins - 1 else start + merged
            group = sliced[start:stop]
            nonzero = sum(1 for x in group if x != 0)
            total = sum(group)
            for k in range(start, stop):
                expanded[k] = total / nonzero if sliced[k] != 0 and nonzero else 0.0
        p, q = smooth(reference), smooth(expanded)
        if p is None or q is None:
            continue
        d = kl(p, q)
        if d < best:
            best, best_i = d, i
    return best_i * bin_width


def _hist(values, bins=2048):
    h = StreamingHistogram(bins)
    h.update(values)
    return h


@pytest.mark.parametrize("seed,dist", [(0, "normal"), (1, "laplace"), (2, "outliers")])
def test_entropy_matches_plain_reference(seed, dist):
    rng = np.random.default_rng(seed)
    values = {"normal": rng.normal(size=20000), "laplace": rng.laplace(size=20000),
              "outliers": np.concatenate([rng.normal(size=20000), rng.normal(size=20) * 40])}[dist]
    hist = _hist(values, bins=512)  # 512 bins keeps the plain-Python reference fast
    ours = entropy_amax(hist)
    ref = reference_entropy_threshold(hist.counts, hist.bin_width)
    assert ours == pytest.approx(min(ref, hist.amax) if ref >= hist.range else ref, rel=1e-9)


def test_entropy_clips_outliers_and_minmax_does_not():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(size=200000), [500.0]])
    hist = _hist(values)
    assert minmax_amax(hist) == pytest.approx(500.0)
    ent = entropy_amax(hist)
    # The search starts at 128 bins, so the threshold is at least 128 bin widths, and far below the outlier.
    assert 128 * hist.bin_width <= ent < 100.0
    assert 3.0 < percentile_amax(hist, 99.99) < 10.0


def test_percentile_on_uniform():
    values = np.linspace(0, 1, 100001)
    hist = _hist(values)
    assert percentile_amax(hist, 50.0) == pytest.approx(0.5, abs=2 / 2048)
    assert percentile_amax(hist, 99.99) == pytest.approx(0.9999, abs=2 / 2048)


def test_growing_range_rebins_exactly():
    """Streaming in pieces whose range grows gives the same histogram as one pass at the final range."""
    rng = np.random.default_rng(3)
    parts = [rng.uniform(0, 1, 1000), rng.uniform(0, 3.5, 1000), rng.uniform(0, 7.9, 1000)]
    streamed = StreamingHistogram(64)
    for part in parts:
        streamed.update(part)
    assert streamed.range == pytest.approx(8 * parts[0].max(), rel=1e-6)  # doubled three times
    direct = np.histogram(np.concatenate(parts), bins=64, range=(0, streamed.range))[0]
    # Values exactly on a bin edge can sit one bin apart; everything else agrees.
    assert np.abs(streamed.counts - direct).sum() <= 2
    assert streamed.counts.sum() == 3000


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=50), min_size=1, max_size=8))
def test_histogram_invariants(batches):
    hist = StreamingHistogram(128)
    total = 0
    for batch in batches:
        hist.update(np.array(batch))
        total += len(batch)
    assert hist.counts.sum() == total and len(hist.counts) == 128
    assert hist.amax <= hist.range + 1e-9
    assert hist.amax == pytest.approx(max(abs(x) for b in batches for x in b))
    amax = entropy_amax(hist)
    assert 0 <= amax <= hist.range + 1e-9
