"""copymerge.CopyEngineMerge: a batch's copies into merged outputs, replayed with numpy (pure, no runtime)."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trtforge.runtime.chunking import StreamingMerge, plan_windows
from trtforge.runtime.copymerge import CopyEngineMerge
from trtforge.runtime.outpool import OutputPool


def _allocate(nbytes):
    return np.empty(nbytes, np.uint8), lambda: None


def _replay(copies, device: np.ndarray, slot: np.ndarray) -> None:
    """What the runtime issues: slot rows, then each strided copy row by row, byte for byte (as cuMemcpy2DAsync)."""
    raw = device.view(np.uint8).reshape(-1)
    for first, rows in copies.slot_rows:
        slot[first : first + rows] = device[first : first + rows]
    for address, pitch, offset, device_pitch, width, rows in copies.strided:
        assert rows == 1 or (pitch >= width and device_pitch >= width)
        for r in range(rows):
            dst = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * width).from_address(address + r * pitch))
            dst[:] = raw[offset + r * device_pitch : offset + r * device_pitch + width]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=5), st.integers(1, 16), st.booleans(), st.data())
def test_copies_and_the_host_merge_of_the_rest_equal_merging_every_window_on_the_host(lengths, batch_size, full_last, data):
    """Inputs of any lengths (single-window ones merged on the host), windows batched in order as run batches them,
    some inputs without a prepared merged output: the copy engine's copies plus the host merge of the slot rows equal
    StreamingMerge.add of every window, and every row is either copied or in the slot, never both."""
    chunk, overlap, feature, capacity = 64, 8, 3, 62  # 62 document tokens per window beside 2 specials
    rng = np.random.default_rng(sum(lengths))
    windows = {d: plan_windows(n, capacity, overlap, full_last) for d, n in enumerate(lengths)}
    prepared = {d: data.draw(st.booleans()) for d in windows}
    streams, reference = {}, {}
    for d, ws in windows.items():
        reference[d] = StreamingMerge(ws, lengths[d])
        if len(ws) > 1:  # prepared: from a page-locked pool (a stand-in allocator here); else numpy memory, lazily
            streams[d] = StreamingMerge(ws, lengths[d], pool=OutputPool(allocate=_allocate) if prepared[d] else None)
            if prepared[d]:
                streams[d].preallocate((feature,), np.float32)
                streams[d].merged[...] = np.nan
    # where a window's document positions start in its row: after 0-2 specials, or at 0 with no content slice
    start = data.draw(st.sampled_from([None, 0, 1, 2]))
    chunks = [
        SimpleNamespace(doc=d, index=i, content=None if start is None else slice(start, start + w.length))
        for d, ws in windows.items()
        for i, w in enumerate(ws)
    ]
    plan = CopyEngineMerge(["h"], {"h": np.float32}, lambda d, n: streams.get(d), lambda d: len(windows[d]))
    for at in range(0, len(chunks), batch_size):
        batch = chunks[at : at + batch_size]
        device = rng.standard_normal((len(batch), chunk, feature)).astype(np.float32)
        slot = np.full_like(device, np.nan)
        copies, placed = plan.place(batch, {"h": device.shape})
        _replay(copies["h"], device, slot)
        in_slot = {r for first, rows in copies["h"].slot_rows for r in range(first, first + rows)}
        assert in_slot.isdisjoint(placed["h"].rows) and in_slot | placed["h"].rows == set(range(len(batch)))
        for d, first, count in placed["h"].runs:
            streams[d].mark(first, count)
        for j, c in enumerate(batch):
            part = device[j, c.content if c.content is not None else slice(0, windows[c.doc][c.index].length)]
            reference[c.doc].add(c.index, part)
            if j in in_slot and c.doc in streams:
                streams[c.doc].add(c.index, slot[j, c.content if c.content is not None else slice(0, len(part))])
    for d in windows:
        if d in streams:
            np.testing.assert_array_equal(streams[d].result(), reference[d].result())
    unprepared = sum(len(windows[d]) for d in streams if not prepared[d])
    assert plan.counts["rows"] == sum(len(windows[d]) for d in streams if prepared[d])
    assert plan.counts["host_rows"] == len(chunks) - plan.counts["rows"] and plan.counts["host_rows"] >= unprepared


def test_a_window_past_its_row_or_another_layout_goes_through_the_host():
    ws = plan_windows(200, 62, 8)
    stream = StreamingMerge(ws, 200, pool=OutputPool(allocate=_allocate))
    stream.preallocate((3,), np.float32)
    batch = [SimpleNamespace(doc=0, index=i, content=slice(1, 1 + w.length)) for i, w in enumerate(ws)]
    plan = CopyEngineMerge(["h"], {"h": np.float32}, lambda d, n: stream, lambda d: len(ws))
    copies, placed = plan.place(batch, {"h": (len(batch), 40, 3)})  # rows of 40 positions: windows need 63
    assert not placed["h"].rows and copies["h"].slot_rows == [(0, len(batch))]
    copies, placed = plan.place(batch, {"h": (len(batch), 64, 4)})  # another feature size than the merged output's
    assert not placed["h"].rows
    copies, placed = plan.place(batch, {"h": (len(batch), 64, 3)})
    assert placed["h"].rows == set(range(len(batch))) and copies["h"].slot_rows == []
    numpy_memory = StreamingMerge(ws, 200)
    numpy_memory.preallocate((3,), np.float32)  # not page-locked: an asynchronous copy may not write into it
    copies, placed = CopyEngineMerge(["h"], {"h": np.float32}, lambda d, n: numpy_memory, lambda d: len(ws)).place(
        batch, {"h": (len(batch), 64, 3)}
    )
    assert not placed["h"].rows


def test_reserve_bytes_covers_the_windows_in_flight_at_most_every_inputs_whole_output():
    from trtforge.runtime.copymerge import reserve_bytes
    from trtforge.runtime.outpool import capacity_for

    # 2.5 x 10 windows x 256 positions x 8 bytes, under the whole bound
    assert reserve_bytes([100_000, 50_000], 8, 10, 256) == int(2.5 * 10 * 256 * 8)
    whole = (capacity_for(1000) + capacity_for(300)) * 8
    assert reserve_bytes([1000, 300, 0], 8, 10, 256) == whole  # small inputs: no more than all of them can take
    assert reserve_bytes([100_000, 50_000], 8, None, 256) == (capacity_for(100_000) + capacity_for(50_000)) * 8  # unbounded
    assert reserve_bytes([], 8, 10, 256) == 0
