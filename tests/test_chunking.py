import numpy as np
import pytest
from chunk_oracles import merge_windows, tile_weight_maps
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.core.errors import UserError
from trtforge.runtime.chunking import (
    Window,
    merge_logits,
    merge_tiles,
    plan_tiles,
    plan_windows,
    pooled_mean,
    window_weights,
    windows_from_spans,
)

lengths = st.integers(1, 3000)
chunks = st.integers(2, 600)


@settings(max_examples=200, deadline=None)
@given(lengths, chunks, st.data())
def test_windows_cover_every_position_once_kept(length, chunk, data):
    overlap = data.draw(st.integers(0, chunk - 1))
    windows = plan_windows(length, chunk, overlap)
    assert windows[0].start == 0 and windows[-1].end == length
    assert all(w.length <= chunk for w in windows)
    assert all(w.length == chunk for w in windows[:-1])  # only the last one is shorter
    for a, b in zip(windows, windows[1:]):
        assert b.start == a.start + chunk - overlap and b.start <= a.end  # no gap
        assert a.end - b.start == overlap  # overlap as planned
        assert a.keep_end == b.keep_start == (b.start + a.end) // 2  # kept parts tile the sequence, handing over mid-overlap
    assert all(type(w) is Window and len(w) == 4 for w in windows)  # real Windows (built without _make's frame)
    covered = np.zeros(length, int)
    for w in windows:
        covered[w.keep_start : w.keep_end] += 1
        assert w.start <= w.keep_start <= w.keep_end <= w.end
    assert (covered == 1).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 60)), min_size=1, max_size=12))
def test_windows_from_spans_keep_from_the_middle_of_each_overlap(steps):
    """Ordered, overlapping or touching spans (a tokenizer's windows, scaled tiles): each keeps from the middle of its
    overlap with the one before to the middle of its overlap with the one after."""
    spans, start = [], 0
    for advance, size in steps:
        start += advance if spans else 0
        end = max(start + size, spans[-1][1] if spans else 0)
        spans.append((start, end))
        start = min(start, end)
    windows = windows_from_spans(spans)
    middles = [(b[0] + a[1]) // 2 for a, b in zip(spans, spans[1:])]
    assert windows == [Window(s, e, k0, k1) for (s, e), k0, k1 in zip(spans, [spans[0][0], *middles], [*middles, spans[-1][1]])]
    assert all(type(w) is Window for w in windows) and windows_from_spans([]) == []


@settings(max_examples=200, deadline=None)
@given(lengths, chunks, st.data())
def test_a_full_last_window_ends_the_sequence_at_full_length(length, chunk, data):
    """run's default plan: every window as long as the chunk (one shape, one batch group), the last one ending at
    the sequence's end; the others as planned without it, and the kept parts still tile the sequence."""
    overlap = data.draw(st.integers(0, chunk - 1))
    short, full = plan_windows(length, chunk, overlap), plan_windows(length, chunk, overlap, full_last=True)
    assert len(full) == len(short) and full[-1].end == length
    assert all(w.length == min(chunk, length) for w in full)
    assert [(w.start, w.end) for w in full[:-1]] == [(w.start, w.end) for w in short[:-1]]
    covered = np.zeros(length, int)
    for a, b in zip(full, full[1:]):
        assert a.start < b.start <= a.end and a.keep_end == b.keep_start
    for w in full:
        assert w.start <= w.keep_start <= w.keep_end <= w.end
        covered[w.keep_start : w.keep_end] += 1
    assert (covered == 1).all()
    for merge in ("center", "linear"):  # a position-wise signal survives the merge
        signal = np.arange(length, dtype=np.float64)[:, None]
        merged = merge_windows([signal[w.start : w.end] for w in full], full, length, merge)
        np.testing.assert_allclose(merged, signal)


@settings(max_examples=100, deadline=None)
@given(lengths, chunks, st.sampled_from(["center", "linear", "cosine", "gaussian"]), st.data())
def test_blend_weights_sum_to_one(length, chunk, merge, data):
    overlap = data.draw(st.integers(0, chunk - 1))
    windows = plan_windows(length, chunk, overlap)
    total = np.zeros(length)
    for w, wt in zip(windows, window_weights(windows, length, merge)):
        assert (wt >= 0).all()
        total[w.start : w.end] += wt
    np.testing.assert_allclose(total, 1.0, atol=1e-12)


@pytest.mark.parametrize("merge", ["center", "linear", "cosine", "gaussian"])
def test_merge_reconstructs_a_position_wise_signal(merge):
    signal = np.random.default_rng(0).normal(size=(1000, 3))
    windows = plan_windows(1000, 128, 32)
    outs = [signal[w.start : w.end] for w in windows]
    np.testing.assert_allclose(merge_windows(outs, windows, 1000, merge), signal, atol=1e-12)


def test_bad_plans():
    with pytest.raises(UserError, match="overlap \\(256\\) must be >= 0 and smaller than the chunk size \\(256\\)"):
        plan_windows(1000, 256, 256)
    with pytest.raises(UserError, match="unknown merge"):
        window_weights(plan_windows(10, 4, 1), 10, "max")


def test_issue_example_8192_tokens():
    windows = plan_windows(8192, 512, 64)
    assert len(windows) == 19 and windows[-1].length == 8192 - 18 * 448


def test_pooled_mean_equals_mean_of_merged_tokens():
    tokens = np.random.default_rng(1).normal(size=(700, 8))
    windows = plan_windows(700, 256, 32)
    means = [tokens[w.keep_start : w.keep_end].mean(axis=0) for w in windows]
    counts = [w.keep_end - w.keep_start for w in windows]
    np.testing.assert_allclose(pooled_mean(means, counts), tokens.mean(axis=0), atol=1e-12)


def test_merge_logits():
    a, b = np.array([2.0, 0.0]), np.array([0.0, 1.0])
    probs = merge_logits([a, b], [3, 1])
    assert probs.sum() == pytest.approx(1.0) and probs.argmax() == 0
    assert merge_logits([a, b, b], [1, 1, 1], mode="vote").tolist() == pytest.approx([1 / 3, 2 / 3])


@settings(max_examples=40, deadline=None)
@given(st.integers(8, 300), st.integers(8, 300), st.integers(4, 128), st.sampled_from(["center", "linear", "gaussian"]), st.data())
def test_tile_weights_sum_to_one_and_cover(h, w, tile, merge, data):
    overlap = data.draw(st.integers(0, tile - 1))
    total = np.zeros((h, w))
    for t, wt in zip(plan_tiles(h, w, tile, overlap), tile_weight_maps(h, w, tile, overlap, merge)):
        total[t.rows.start : t.rows.end, t.cols.start : t.cols.end] += wt
    np.testing.assert_allclose(total, 1.0, atol=1e-12)


def test_merge_tiles_reconstructs_pixelwise_image():
    image = np.random.default_rng(2).normal(size=(4, 100, 77))
    tiles = plan_tiles(100, 77, 32, 8)
    outs = [image[:, t.rows.start : t.rows.end, t.cols.start : t.cols.end] for t in tiles]
    for merge in ("center", "linear", "gaussian"):
        np.testing.assert_allclose(merge_tiles(outs, 100, 77, 32, 8, merge), image, atol=1e-12)


def test_tiled_tiny_fcn_equals_whole_image():
    """Overlap >= the receptive field (9): centre-merged tiles reproduce the whole-image output."""
    torch = pytest.importorskip("torch")
    from trtforge.models.tiny_fcn import RECEPTIVE_FIELD, load

    module = load().module
    image = torch.rand(1, 3, 150, 130, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = module(image).numpy()
        overlap = RECEPTIVE_FIELD - 1 + 8  # each kept pixel sits >= 8 pixels inside its tile
        tiles = plan_tiles(150, 130, 64, overlap)
        outs = [module(image[..., t.rows.start : t.rows.end, t.cols.start : t.cols.end]).numpy() for t in tiles]
    for merge, tol in (("center", 1e-5), ("linear", 2e-2), ("gaussian", 2e-2)):
        merged = merge_tiles(outs, 150, 130, 64, overlap, merge)
        rel = np.linalg.norm(merged - whole) / np.linalg.norm(whole)
        assert rel < tol, (merge, rel)


def test_a_preallocated_merge_equals_the_lazy_one_and_refuses_another_shape():
    """StreamingMerge.preallocate (run pages in each input's merged output on its planning thread): same
    result as allocating on the first window; a window of another feature shape is refused, not broadcast."""
    from trtforge.runtime.chunking import StreamingMerge, plan_windows

    windows = plan_windows(50, 16, 4)
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((w.length, 3)).astype(np.float32) for w in windows]
    for merge in ("center", "linear"):
        lazy, early = StreamingMerge(windows, 50, merge), StreamingMerge(windows, 50, merge)
        early.preallocate((3,), np.float32)
        for i in reversed(range(len(windows))):
            lazy.add(i, parts[i])
            early.add(i, parts[i])
        np.testing.assert_array_equal(lazy.result(), early.result())
    wrong = StreamingMerge(windows, 50)
    wrong.preallocate((4,), np.float32)
    with pytest.raises(ValueError, match="per position"):
        wrong.add(0, parts[0])


@settings(max_examples=80, deadline=None)
@given(st.integers(20, 400), st.integers(4, 64), st.data())
def test_take_equals_adding_each_window(length, chunk, data):
    """StreamingMerge.take (run merges a batch's consecutive windows of one input with one np.take) must give what
    add gives window by window, for any run of windows placed anywhere in a flattened batch, with short or
    full-length last windows, and into a merged output of another dtype (the copying path)."""
    from trtforge.runtime.chunking import StreamingMerge

    overlap = data.draw(st.integers(0, chunk - 1))
    windows = plan_windows(length, chunk, overlap, full_last=data.draw(st.booleans()))
    rng = np.random.default_rng(length * 1000 + chunk)
    source_dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    parts = [rng.standard_normal((w.length, 2)).astype(np.float32) for w in windows]
    by_add, by_take = StreamingMerge(windows, length), StreamingMerge(windows, length)
    by_take.preallocate((2,), np.float32)  # float64 sources then go through the copying path
    for i, p in enumerate(parts):
        by_add.add(i, p)
    i = 0
    while i < len(windows):  # runs of 1-4 windows, each in a row of `chunk + 3` positions at a drawn offset
        n = data.draw(st.integers(1, 4))
        run = parts[i : i + n]
        row = chunk + 3
        source = np.full((len(run) * row, 2), np.nan, source_dtype)
        offsets = []
        for k, p in enumerate(run):
            at = k * row + data.draw(st.integers(0, row - len(p)))
            source[at : at + len(p)] = p
            offsets.append(at)
        by_take.take(i, source, offsets)
        i += len(run)
    np.testing.assert_array_equal(by_take.result(), by_add.result())


@settings(max_examples=80, deadline=None)
@given(st.integers(20, 400), st.integers(4, 64), st.data())
def test_run_copies_of_a_batchs_windows_equal_adding_each_window(length, chunk, data):
    """The copy-engine merge (run, --copy-engine-merge) writes a batch's kept slices with one strided (2-D) copy per
    stretch of like windows: replayed here with numpy, row by row as cuMemcpy2DAsync copies them, run_copies' copies
    must give what add gives window by window, fill every kept position once, and be the copies segments() lists."""
    from trtforge.runtime.chunking import StreamingMerge

    overlap = data.draw(st.integers(0, chunk - 1))
    windows = plan_windows(length, chunk, overlap, full_last=data.draw(st.booleans()))
    rng = np.random.default_rng(length * 1000 + chunk)
    parts = [rng.standard_normal((w.length, 2)).astype(np.float32) for w in windows]
    by_add, placed = StreamingMerge(windows, length), StreamingMerge(windows, length)
    for i, p in enumerate(parts):
        by_add.add(i, p)
    merged = np.full((length, 2), np.nan, np.float32)
    written = np.zeros(length, np.int64)
    i = 0
    while i < len(windows):  # a batch's rows: runs of 1-5 windows, each in a row of `chunk` positions
        n = data.draw(st.integers(1, 5))
        run = parts[i : i + n]
        first_row = data.draw(st.integers(0, 3))  # rows of other inputs before this run in the batch
        shift = chunk - max(len(p) for p in run) if data.draw(st.booleans()) else 0  # where positions start in a row
        source = np.full(((first_row + len(run)) * chunk, 2), np.nan, np.float32)
        for k, p in enumerate(run):
            at = (first_row + k) * chunk + shift
            source[at : at + len(p)] = p
        copies = placed.run_copies(i, len(run), first_row * chunk + shift, chunk)
        listed = placed.segments(i, [(first_row + k) * chunk + shift for k in range(len(run))], source.shape[0])
        assert [(s + r * ss, d + r * ds, w) for s, d, w, c, ss, ds in copies for r in range(c)] == [x for x in listed if x[2]]
        for src, dst, width, count, src_step, dst_step in copies:
            assert count == 1 or (src_step >= width and dst_step >= width)  # 2-D pitches are at least the width
            for r in range(count):
                merged[dst + r * dst_step : dst + r * dst_step + width] = source[src + r * src_step : src + r * src_step + width]
                written[dst + r * dst_step : dst + r * dst_step + width] += 1
        placed.mark(i, len(run))
        i += len(run)
    assert (written == 1).all()
    np.testing.assert_array_equal(merged, by_add.result())
    assert len(placed.seen) == len(windows)


def test_run_copies_join_like_windows_only():
    from trtforge.runtime.chunking import StreamingMerge, kept_stretches

    # 1,000 positions in windows of 256 advancing by 224: the first keeps 240 from 0, three interior ones 224 from 16
    # (one stretch), the last 88 from 16
    windows = plan_windows(1000, 256, 32)
    assert kept_stretches(windows) == [(0, 1, 0, 240, 0, 0), (1, 3, 16, 224, 240, 224), (4, 1, 16, 88, 912, 0)]
    merge = StreamingMerge(windows, 1000)
    assert merge.run_copies(0, 5, 0, 256) == [(0, 0, 240, 1, 0, 0), (272, 240, 224, 3, 256, 224), (1040, 912, 88, 1, 0, 0)]
    assert merge.run_copies(2, 1, 512, 256) == [(528, 464, 224, 1, 0, 0)]  # one window of a stretch: a plain copy
    assert merge.run_copies(2, 3, 0, 300) == [(16, 464, 224, 2, 300, 224), (616, 912, 88, 1, 0, 0)]
    assert merge.run_copies(3, 0, 0, 256) == []
    with pytest.raises(ValueError, match="not all in this merge"):
        merge.run_copies(4, 2, 0, 256)
    with pytest.raises(ValueError, match="only 'center'"):
        StreamingMerge(windows, 1000, "linear").run_copies(0, 1, 0, 256)
    assert kept_stretches([]) == []


def test_take_refuses_what_it_cannot_merge():
    from trtforge.runtime.chunking import StreamingMerge

    windows = plan_windows(50, 16, 4)
    source = np.zeros((40, 3), np.float32)
    with pytest.raises(ValueError, match="run past"):
        StreamingMerge(windows, 50).take(0, source, [0, 30])  # the second window would need rows 30..45
    with pytest.raises(ValueError, match="not all in this merge"):
        StreamingMerge(windows, 50).take(len(windows) - 1, source, [0, 16])
    with pytest.raises(ValueError, match="'center' windows only"):
        StreamingMerge(windows, 50, "linear").take(0, source, [0])
    with pytest.raises(ValueError, match="per position"):
        early = StreamingMerge(windows, 50)
        early.preallocate((4,), np.float32)
        early.take(0, source, [0])


@settings(max_examples=60, deadline=None)
@given(st.integers(20, 300), st.integers(4, 48), st.sampled_from(["center", "linear", "cosine"]), st.booleans(), st.data())
def test_a_merge_into_reused_pool_memory_equals_a_fresh_one(length, chunk, merge, early, data):
    """run merges into pooled buffers that held an earlier input's output (outpool.py) and are not cleared for
    'center': every position must be written, and blends must start from zero, whatever the buffer held."""
    from trtforge.runtime.chunking import StreamingMerge
    from trtforge.runtime.outpool import OutputPool

    windows = plan_windows(length, chunk, data.draw(st.integers(0, chunk - 1)), full_last=data.draw(st.booleans()))
    rng = np.random.default_rng(length + 7 * chunk)
    parts = [rng.standard_normal((w.length, 2)).astype(np.float32) for w in windows]
    pool = OutputPool()
    dirty, _ = pool.take(length + data.draw(st.integers(0, length // 2)), (2,), np.float32)  # within the pool's 2x reuse cap
    dirty[...] = np.nan  # what an earlier input left behind
    pool.give(dirty)
    fresh, pooled = StreamingMerge(windows, length, merge), StreamingMerge(windows, length, merge, pool)
    if early:
        pooled.preallocate((2,), np.float32)
    for i in data.draw(st.permutations(range(len(windows)))):
        fresh.add(i, parts[i])
        pooled.add(i, parts[i])
    assert np.shares_memory(pooled.merged, dirty)  # it did reuse the dirty buffer
    np.testing.assert_array_equal(pooled.result(), fresh.result())
    pooled.release()
    assert pool.report()["reused"] == 1 and pooled.merged is None


def test_center_merges_into_pool_memory_refuse_windows_that_leave_a_gap():
    from trtforge.runtime.chunking import StreamingMerge, Window, check_center_cover
    from trtforge.runtime.outpool import OutputPool

    check_center_cover(plan_windows(50, 16, 4), 50)
    gap = [Window(0, 10, 0, 10), Window(12, 20, 12, 20)]
    with pytest.raises(ValueError, match="do not tile"):
        StreamingMerge(gap, 20, "center", OutputPool())
    with pytest.raises(ValueError, match="end at 20, not at the 25"):
        check_center_cover([Window(0, 10, 0, 10), Window(10, 20, 10, 20)], 25)
    StreamingMerge(gap, 20, "center")  # without a pool the output is zeroed: no check needed


def test_row_runs_join_consecutive_windows_of_one_input_in_consecutive_rows():
    """The grouping the host merge (one np.take a run) and the copy-engine merge (strided copies a run) share: a run is
    consecutive windows of one input in consecutive rows at one content offset; `length` the longest window's."""
    from types import SimpleNamespace

    from trtforge.runtime.chunking import RowRun, Tile, Window, row_runs

    def chunk(d, i, start=1, n=5):
        return SimpleNamespace(doc=d, index=i, content=slice(start, start + n), window=Window(0, n, 0, n))

    batch = [chunk(0, 0), chunk(0, 1, n=3), chunk(1, 0), chunk(0, 2), chunk(2, 0), chunk(2, 1, start=0), chunk(0, 4)]
    assert row_runs(batch) == [
        RowRun(0, 0, 0, 2, 1, 5),
        RowRun(1, 0, 2, 1, 1, 5),
        RowRun(0, 2, 3, 1, 1, 5),
        RowRun(2, 0, 4, 1, 1, 5),
        RowRun(2, 1, 5, 1, 0, 5),
        RowRun(0, 4, 6, 1, 1, 5),
    ]
    assert row_runs(batch, [0, 1, 3]) == [RowRun(0, 0, 0, 2, 1, 5), RowRun(0, 2, 3, 1, 1, 5)]  # rows 1 and 3 are not adjacent
    assert row_runs(batch, []) == []
    tiles = [SimpleNamespace(doc=0, index=i, content=None, window=Tile(Window(0, 4, 0, 4), Window(0, 4, 0, 4))) for i in range(2)]
    assert row_runs(tiles) == [RowRun(0, 0, 0, 2, 0, None)]  # a tile has no length along one axis


def test_throughput_unit_names_what_a_length_counts():
    from trtforge.runtime.documents import length_unit

    assert length_unit({"text"}) == "tokens" and length_unit({"image"}) == "pixels"
    assert length_unit({"seq"}) == "positions" and length_unit({"text", "seq"}) == "positions"
