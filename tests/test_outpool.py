"""outpool.OutputPool: merged outputs' host memory reused from one input to the next (pure numpy, no runtime)."""

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trtforge.runtime.outpool import OutputPool, capacity_for


@given(st.integers(1, 10_000_000))
def test_a_buffer_holds_its_length_with_at_most_an_eighth_more(length):
    cap = capacity_for(length)
    assert length <= cap <= length + length // 8
    assert capacity_for(cap) == cap  # the grid is closed: a buffer of that size is reused as is


def test_a_given_back_buffer_serves_the_next_input_that_fits_and_says_it_is_mapped():
    pool = OutputPool()
    first, mapped = pool.take(1000, (4,), np.float32)
    assert first.shape == (1000, 4) and first.dtype == np.float32 and not mapped
    first[...] = 7
    pool.give(first)
    again, mapped = pool.take(990, (4,), np.float32)  # smaller: the same memory, its pages mapped already
    assert mapped and again.shape == (990, 4) and np.shares_memory(again, first)
    other, mapped = pool.take(990, (4,), np.float16)  # another dtype (or feature shape) never shares a buffer
    assert not mapped and not np.shares_memory(other, first)
    bigger, mapped = pool.take(2000, (4,), np.float32)  # larger than any idle buffer: fresh
    assert not mapped
    assert pool.report()["reused"] == 1 and pool.report()["fresh"] == 3


def test_the_smallest_idle_buffer_that_holds_the_request_is_taken():
    pool = OutputPool()
    arrays = [pool.take(n, (2,), np.float32)[0] for n in (100, 5000, 800)]
    for a in arrays:
        pool.give(a)
    got, mapped = pool.take(700, (2,), np.float32)
    assert mapped and np.shares_memory(got, arrays[2])  # 800 serves 700; 5000 is kept for larger inputs


def test_giving_back_what_the_pool_did_not_hand_out_is_refused():
    pool = OutputPool()
    with pytest.raises(ValueError, match="not taken from the pool"):
        pool.give(np.zeros((10, 2), np.float32))
    a, _ = pool.take(10, (2,), np.float32)
    pool.give(a)
    with pytest.raises(ValueError, match="given back already"):
        pool.give(a)


def test_idle_memory_beyond_the_limit_is_let_go_smallest_first():
    one = capacity_for(1000) * 4 * 4
    pool = OutputPool(idle_limit=2 * one + 10)
    small, _ = pool.take(100, (4,), np.float32)
    big = [pool.take(1000, (4,), np.float32)[0] for _ in range(2)]
    for a in [small] + big:
        pool.give(a)
    assert pool.idle_bytes <= pool.idle_limit and pool.report()["dropped"] == 1
    got, mapped = pool.take(600, (4,), np.float32)  # the small buffer went: a big one serves
    assert mapped and got.base.shape[0] == capacity_for(1000)


def test_a_far_larger_idle_buffer_is_kept_for_a_larger_input():
    pool = OutputPool()
    big, _ = pool.take(100_000, (4,), np.float32)
    pool.give(big)
    small, mapped = pool.take(100, (4,), np.float32)  # would leave 99.9% of it unused: fresh instead
    assert not mapped and not np.shares_memory(small, big)
    again, mapped = pool.take(60_000, (4,), np.float32)  # within twice its size: reused
    assert mapped and np.shares_memory(again, big)


def test_buffers_taken_at_once_from_several_threads_never_overlap():
    pool = OutputPool()
    live, errors = [], []
    lock = threading.Lock()

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                a, _ = pool.take(int(rng.integers(1, 3000)), (3,), np.float32)
                a[...] = seed
                with lock:
                    if any(np.shares_memory(a, b) for b in live):
                        errors.append("a buffer was handed out while another holder had it")
                    live.append(a)
                    mine = live.pop(int(rng.integers(len(live))))
                if not np.all(mine == mine.flat[0]):  # written by one thread only while it was live
                    errors.append("a live buffer was written by two holders")
                pool.give(mine)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    report = pool.report()
    assert report["taken"] == 800 and report["reused"] > 0


def test_an_allocator_gives_the_buffers_and_frees_the_dropped_and_at_close():
    """run's copy-engine merge takes page-locked buffers (pool `allocate`): fresh ones come from it, reuse costs no new
    allocation, a buffer let go past the idle limit is freed at once, and close() frees the rest, in use or idle."""
    allocated, freed = {}, []

    def allocate(nbytes):
        raw = np.empty(nbytes, np.uint8)
        allocated[raw.ctypes.data] = nbytes
        return raw, lambda address=raw.ctypes.data: freed.append(address)

    pool = OutputPool(idle_limit=6000, allocate=allocate)
    a, mapped = pool.take(100, (4,), np.float32)  # 1,600 B
    assert mapped and a.shape == (100, 4) and a.ctypes.data in allocated
    pool.give(a)
    again, mapped = pool.take(100, (4,), np.float32)
    assert mapped and again.ctypes.data == a.ctypes.data and len(allocated) == 1
    big, _ = pool.take(1000, (4,), np.float32)  # 16,000 B: idle beyond the limit once given back
    pool.give(big)
    assert freed == [big.ctypes.data] and pool.report()["dropped"] == 1 and pool.report()["memory"] == "page-locked"
    small, _ = pool.take(10, (4,), np.float32)
    pool.give(small)
    pool.close()
    assert sorted(freed) == sorted(allocated)  # every allocation freed once: the one in use, the idle one, the dropped one
    assert OutputPool().report()["memory"] == "numpy"


def test_reserved_memory_carves_page_aligned_pieces_then_allocates_beyond_and_frees_the_block_once():
    from trtforge.runtime.outpool import ReservedMemory

    given, freed = [], []

    def allocate(nbytes):
        raw = np.zeros(nbytes, np.uint8)
        given.append(nbytes)
        return raw, lambda: freed.append(nbytes)

    reserved = ReservedMemory(3 * 4096, allocate)
    a, free_a = reserved(100)
    b, free_b = reserved(4097)  # two pages: the block has one left
    assert a.nbytes == 100 and b.nbytes == 4097 and given == [3 * 4096]
    assert a.ctypes.data == reserved.block.ctypes.data and b.ctypes.data == a.ctypes.data + 4096  # page-aligned, in order
    c, free_c = reserved(4096)  # past the block: from the allocator itself
    assert given == [3 * 4096, 4096] and not np.shares_memory(c, reserved.block)
    free_a(), free_b()
    assert freed == []  # a carved piece goes back with the block, not on its own
    free_c()
    assert freed == [4096]
    assert reserved.report() == {
        "carved": 2,
        "beyond": 1,
        "reserved_mb": round(3 * 4096 / 2**20, 3),
        "used_mb": round(3 * 4096 / 2**20, 3),
        "beyond_mb": round(4096 / 2**20, 3),
    }
    reserved.close(), reserved.close()
    assert freed == [4096, 3 * 4096]  # the block freed once
    nothing = ReservedMemory(0, allocate)  # no reserve: every buffer from the allocator
    nothing(10)
    assert given[-1] == 10 and nothing.report()["beyond"] == 1


def test_a_pool_on_reserved_memory_hands_out_pieces_of_the_block_that_never_overlap():
    from trtforge.runtime.outpool import ReservedMemory

    reserved = ReservedMemory(1 << 20, lambda n: (np.zeros(n, np.uint8), lambda: None))
    pool = OutputPool(allocate=reserved)
    taken = [pool.take(n, (3,), np.float32) for n in (100, 257, 1000, 20)]
    assert all(mapped and np.shares_memory(array, reserved.block) for array, mapped in taken)
    for i, (x, _) in enumerate(taken):
        x[...] = i
    assert all((x == i).all() for i, (x, _) in enumerate(taken))  # no piece overlaps another
