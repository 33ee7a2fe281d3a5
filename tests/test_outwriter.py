"""run --save-outputs: each input's outputs written as it finishes (outwriter.OutputWriter, artifacts.NpzStream)."""

import threading
import time

import numpy as np
import pytest

from trtforge.core.artifacts import NpzStream
from trtforge.core.errors import UserError
from trtforge.runtime.outwriter import OutputWriter


def test_an_npz_written_array_by_array_loads_as_np_savez_writes_it(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "doc/a": rng.standard_normal((5, 3)).astype(np.float32),
        "doc/b": np.arange(4, dtype=np.int64),
        "other/a": rng.standard_normal((2, 2, 2)).astype(np.float16),
    }
    np.savez(tmp_path / "ref.npz", **arrays)
    stream = NpzStream(tmp_path / "out.npz")
    for k, v in arrays.items():
        stream.write(k, v)
    with pytest.raises(ValueError, match="already holds 'doc/a'"):
        stream.write("doc/a", arrays["doc/a"])
    assert not (tmp_path / "out.npz").exists()  # under a temp name until closed
    stream.close()
    ref, got = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "out.npz")
    assert sorted(ref.files) == sorted(got.files)
    for k in ref.files:
        np.testing.assert_array_equal(ref[k], got[k])
        assert ref[k].dtype == got[k].dtype
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "ref.npz"]  # no temp file left


def test_an_aborted_npz_leaves_nothing(tmp_path):
    stream = NpzStream(tmp_path / "out.npz")
    stream.write("a/b", np.ones(3))
    stream.abort()
    assert list(tmp_path.iterdir()) == []


def test_an_inputs_memory_is_released_only_once_its_outputs_are_on_disk(tmp_path, monkeypatch):
    """The merge hands an input over and goes on; its memory goes back to the pool (and is overwritten by later
    inputs) only after the writer has written it, even when writing is slow."""
    write = NpzStream.write
    monkeypatch.setattr(NpzStream, "write", lambda self, key, array: (time.sleep(0.02), write(self, key, array))[1])
    writer = OutputWriter(tmp_path / "o.npz")
    expected, released = {}, []
    for d in range(5):
        value = np.full((100, 4), float(d), np.float32)
        expected[f"d{d}/x"] = value.copy()

        def release(value=value, d=d):
            value[...] = np.nan  # what the next input would write there
            released.append(d)

        writer.put(f"d{d}", {"x": value}, release)
    assert len(released) < 5  # put returned before the writing: the merge thread is not held up
    writer.close()
    assert released == list(range(5))
    got = np.load(tmp_path / "o.npz")
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v)


def test_a_failed_write_stops_the_loop_and_leaves_no_file(tmp_path, monkeypatch):
    def full_disk(self, key, array):
        raise UserError("could not write o.npz: No space left on device; free space or choose another path.")

    monkeypatch.setattr(NpzStream, "write", full_disk)
    writer = OutputWriter(tmp_path / "o.npz")
    released = threading.Event()
    writer.put("d0", {"x": np.ones(3)}, released.set)
    assert released.wait(5)
    with pytest.raises(UserError, match="No space left"):
        writer.put("d1", {"x": np.ones(3)}, lambda: None)
    with pytest.raises(UserError, match="No space left"):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def _held_writer(tmp_path, monkeypatch, queued=1):
    """A writer whose writes wait for `go`; returns (writer, go, written keys)."""
    go, written = threading.Event(), []
    write = NpzStream.write

    def held(self, key, array):
        assert go.wait(10)
        written.append(key)
        write(self, key, array)

    monkeypatch.setattr(NpzStream, "write", held)
    return OutputWriter(tmp_path / "o.npz", queued=queued), go, written


def test_a_merge_thread_waits_while_the_writer_is_behind(tmp_path, monkeypatch):
    """At most `queued` inputs wait for the writer: the next put blocks (holding its batch's slot, so the GPU loop
    slows to the disk's pace) instead of memory growing with the corpus."""
    writer, go, written = _held_writer(tmp_path, monkeypatch, queued=1)
    writer.put("d0", {"x": np.ones(2)}, lambda: None)  # taken by the writing thread, which waits in write
    deadline = time.time() + 5
    while writer._queue.qsize() and time.time() < deadline:
        time.sleep(0.01)
    writer.put("d1", {"x": np.ones(2)}, lambda: None)  # queued
    third = threading.Thread(target=writer.put, args=("d2", {"x": np.ones(2)}, lambda: None))
    third.start()
    third.join(0.3)
    assert third.is_alive()  # blocked: one input already waits
    go.set()
    third.join(5)
    assert not third.is_alive()
    writer.close()
    assert written == ["d0/x", "d1/x", "d2/x"]


def test_an_aborted_writer_releases_what_is_queued_without_writing_it(tmp_path, monkeypatch):
    writer, go, written = _held_writer(tmp_path, monkeypatch, queued=4)
    released = []
    for d in range(3):
        writer.put(f"d{d}", {"x": np.ones(2)}, lambda d=d: released.append(d))
    aborting = threading.Thread(target=writer.abort)
    aborting.start()
    time.sleep(0.05)
    go.set()  # the write under way finishes; the queued ones are only released
    aborting.join(5)
    assert not aborting.is_alive() and sorted(released) == [0, 1, 2] and len(written) <= 1
    assert list(tmp_path.iterdir()) == []


def test_a_release_that_fails_is_raised_by_close(tmp_path):
    writer = OutputWriter(tmp_path / "o.npz")

    def broken():
        raise RuntimeError("release failed")

    writer.put("d0", {"x": np.ones(2)}, broken)
    with pytest.raises(RuntimeError, match="release failed"):
        writer.close()
    assert list(tmp_path.iterdir()) == []
