import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.calibrate.methods import StreamingHistogram, canonical_range, entropy_amax, minmax_amax, percentile_amax, quantized_groups


def reference_entropy_threshold(hist_counts, bin_width, num_quantized_bins=128, start_bin=128):
    """Plain transcription of the published algorithm as NVIDIA pytorch-quantization implements it
    (calib/histogram.py `_compute_amax_entropy`: zero bin set to its neighbour, bins spread over the 128
    levels by digitizing against linspace(0, i, 129), scipy's KL, last argmin), loops and all."""
    from collections import Counter

    def entropy(p, q):  # scipy.stats.entropy(p, q)
        sp, sq = sum(p), sum(q)
        total = 0.0
        for a, b in zip(p, q):
            if a == 0:
                continue
            if b == 0:
                return float("inf")
            total += (a / sp) * np.log((a / sp) / (b / sq))
        return total

    bins = [float(c) for c in hist_counts]
    bins[0] = bins[1]
    divergences = []
    for i in range(start_bin, len(bins) + 1):
        space = np.linspace(0, i, num=num_quantized_bins + 1)
        digitized = list(np.digitize(range(i), space) - 1)
        digitized = [-1 if bins[k] == 0 else d for k, d in enumerate(digitized)]
        density = [0.0] * num_quantized_bins
        for k, d in enumerate(digitized):
            if d != -1:
                density[d] += bins[k]
        for key, count in Counter(digitized).items():
            if key != -1:
                density[key] /= count
        expanded = [density[d] if d != -1 else 0.0 for d in digitized]
        reference = bins[:i]
        reference[-1] += sum(bins[i:])
        divergences.append(entropy(reference, expanded))
    last_argmin = len(divergences) - 1 - int(np.argmin(divergences[::-1]))
    return (last_argmin + start_bin) * bin_width


def _hist(values, bins=2048):
    h = StreamingHistogram(bins)
    h.update(values)
    return h


def _gelu(x):
    from math import erf

    return x * 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


@pytest.mark.parametrize("seed,dist", [(0, "gaussian"), (1, "relu"), (2, "gelu"), (3, "laplace"), (4, "outliers")])
def test_entropy_matches_plain_reference(seed, dist):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=20000)
    values = {
        "gaussian": x,
        "relu": np.maximum(x, 0),
        "gelu": _gelu(x),
        "laplace": rng.laplace(size=20000),
        "outliers": np.concatenate([x, rng.normal(size=20) * 40]),
    }[dist]
    hist = _hist(values, bins=512)  # 512 bins keeps the plain-Python reference fast
    ours = entropy_amax(hist)
    ref = reference_entropy_threshold(hist.counts, hist.bin_width)
    assert ours == pytest.approx(min(ref, hist.amax), rel=1e-9)


def test_entropy_zero_bin_on_relu():
    """ReLU puts half the mass in bin 0; without `bins[0] = bins[1]` KL clipped at 1.77 (max 4.73)."""
    values = np.maximum(np.random.default_rng(0).normal(size=1_000_000), 0)
    hist = _hist(values)
    assert 4.0 < entropy_amax(hist) <= hist.amax


def test_quantized_groups_are_even():
    """Every candidate width spreads over the 128 levels with sizes that differ by at most one (the old
    'last group takes the remainder' gave the last level up to 255 bins at i = 383: the sawtooth)."""
    for i in range(128, 2049):
        sizes = np.bincount(quantized_groups(i), minlength=128)
        assert len(sizes) == 128 and sizes.max() - sizes.min() <= 1 and sizes.sum() == i
    space = np.linspace(0, 300, num=129)
    assert (quantized_groups(300) == np.digitize(range(300), space) - 1).all()


def test_entropy_clips_a_heavy_tail_and_minmax_does_not():
    values = np.random.default_rng(0).standard_t(3, size=200000)
    hist = _hist(values)
    assert minmax_amax(hist) == pytest.approx(np.abs(values).max(), rel=1e-6)
    ent = entropy_amax(hist)
    # The search starts at 128 bins, so the threshold is at least 128 bin widths, and well below the max.
    assert 128 * hist.bin_width <= ent < 0.5 * hist.amax


def test_entropy_keeps_an_isolated_outlier():
    """As pytorch-quantization: P holds the clipped tail in a bin where Q is empty, so KL is infinite for every
    candidate that clips a lone outlier sitting in empty space; the threshold is the max (percentile clips it)."""
    rng = np.random.default_rng(0)
    hist = _hist(np.concatenate([rng.normal(size=200000), [500.0]]))
    assert entropy_amax(hist) == pytest.approx(500.0)
    assert 3.0 < percentile_amax(hist, 99.99) < 10.0


def test_percentile_on_uniform():
    values = np.linspace(0, 1, 100001)
    hist = _hist(values)
    assert percentile_amax(hist, 50.0) == pytest.approx(0.5, abs=2 / 2048)
    assert percentile_amax(hist, 99.99) == pytest.approx(0.9999, abs=2 / 2048)


def test_growing_range_rebins_exactly():
    """Streaming in pieces whose range grows gives the same histogram as one pass at the final range,
    which is the smallest power of two above the max."""
    rng = np.random.default_rng(3)
    parts = [rng.uniform(0, 1, 1000), rng.uniform(0, 3.5, 1000), rng.uniform(0, 7.9, 1000)]
    streamed = StreamingHistogram(64)
    for part in parts:
        streamed.update(part)
    assert streamed.range == 8.0
    direct = np.histogram(np.concatenate(parts), bins=64, range=(0, streamed.range))[0]
    assert (streamed.counts == direct).all() and streamed.counts.sum() == 3000


def test_canonical_range_is_the_next_power_of_two():
    assert [canonical_range(x) for x in (0.3, 0.5, 1.0, 1.5, 3.99, 4.0, 1e-30)] == [0.5, 1.0, 2.0, 2.0, 4.0, 8.0, 2.0**-99]


def _split_merge(batches, order, bins=256):
    """Each batch its own histogram, merged in `order` (as shards collected on different actors)."""
    shards = []
    for batch in batches:
        h = StreamingHistogram(bins)
        h.update(batch)
        shards.append(h)
    total = StreamingHistogram(bins)
    for i in order:
        total.merge(shards[i])
    return total


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=50), min_size=1, max_size=8),
    st.randoms(use_true_random=False),
)
def test_merged_shards_equal_one_pass(batches, random):
    """Issue 13: calibration shards merge exactly, in any order (zeros-only shards included)."""
    one = StreamingHistogram(256)
    for batch in batches:
        one.update(np.array(batch))
    order = list(range(len(batches)))
    random.shuffle(order)
    merged = _split_merge([np.array(b) for b in batches], order)
    assert merged.range == one.range and merged.amax == one.amax
    assert (merged.counts == one.counts).all()
    assert entropy_amax(merged) == entropy_amax(one) and percentile_amax(merged) == percentile_amax(one)


def test_merge_realistic_shards_gives_identical_entropy():
    rng = np.random.default_rng(5)
    batches = [rng.standard_t(3, size=5000) * scale for scale in (0.2, 1.0, 5.0, 0.7)]
    one = StreamingHistogram()
    for b in batches:
        one.update(b)
    merged = _split_merge(batches, [3, 1, 0, 2], bins=2048)
    assert (merged.counts == one.counts).all() and entropy_amax(merged) == entropy_amax(one)


def test_merge_refuses_other_bin_counts():
    with pytest.raises(ValueError, match="128 and 256 bins"):
        StreamingHistogram(128).merge(StreamingHistogram(256))


def test_statistics_merge_channel_amax_and_samples():
    from trtforge.calibrate.collect import Statistics

    a = Statistics({"t": _hist([1.0, -2.0])}, {"c": np.array([1.0, 5.0], np.float32)}, samples=2)
    b = Statistics({"t": _hist([7.0])}, {"c": np.array([3.0, 2.0], np.float32), "d": np.array([1.0], np.float32)}, samples=3)
    a.merge(b)
    assert a.samples == 5 and a.histograms["t"].amax == 7.0 and a.histograms["t"].counts.sum() == 3
    assert a.channel_amax["c"].tolist() == [3.0, 5.0] and a.channel_amax["d"].tolist() == [1.0]


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
