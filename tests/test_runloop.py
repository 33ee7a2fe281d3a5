"""The run loop's pure decisions (runloop.py) and TrtRunner driven through a fake CUDA + TensorRT.

No GPU here: the fake executes every stream operation at once, in submission order (a valid
serialization of the real streams), and models what makes CUDA graphs delicate with TensorRT: an
enqueue refreshes a context's host-side shape state, and a captured graph reads that state when it
replays (as TensorRT's shape host-to-device copies do), with its buffer addresses baked in.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from trtforge.backends.cuda_async import submit_calls
from trtforge.runtime.loop import (
    CAPTURE,
    ENQUEUE,
    LAUNCH,
    Batcher,
    GraphCache,
    batch_timeline,
    completion_intervals,
    padded_batch,
    slot_bytes,
    stream_batches,
    wall_over_gpu,
)

# -- GraphCache ------------------------------------------------------------------------------------


def test_graph_cache_captures_after_a_plain_enqueue_and_replays_only_on_the_shape_last_enqueued():
    g = GraphCache()
    steps = [
        ((0, "A", 0), ENQUEUE),
        ((0, "A", 1), CAPTURE),
        ((0, "A", 0), CAPTURE),
        ((0, "A", 1), LAUNCH),
        ((0, "B", 0), ENQUEUE),
        ((0, "A", 1), ENQUEUE),  # the context last ran B: A needs a plain enqueue first
        ((0, "A", 0), LAUNCH),
        ((1, "A", 0), ENQUEUE),
    ]  # another profile's context has its own state
    for (profile, shape, slot), expected in steps:
        action = g.action(profile, shape, slot)
        assert action == expected, (profile, shape, slot)
        g.done(profile, shape, slot, action, graph=object() if action == CAPTURE else None)
    assert g.report()["captured"] == 2 and g.report()["replayed"] == 2 and g.report()["plain_enqueues"] == 4


def test_graph_cache_falls_back_for_good_after_a_failed_capture_and_reports_it():
    g = GraphCache()
    g.done(0, "A", 0, ENQUEUE)
    assert g.action(0, "A", 0) == CAPTURE
    g.done(0, "A", 0, CAPTURE, error="execute_async_v3 failed under capture")
    assert [g.action(0, "A", s) for s in (0, 1)] == [ENQUEUE, ENQUEUE]
    assert g.report()["fallbacks"] == [{"profile": 0, "shape": "A", "reason": "execute_async_v3 failed under capture"}]
    off = GraphCache(enabled=False)
    off.done(0, "A", 0, ENQUEUE)
    assert off.action(0, "A", 0) == ENQUEUE


def test_slot_bytes_holds_every_profiles_largest_tensor():
    assert slot_bytes({0: {"x": 10, "y": 400}, 1: {"x": 40, "y": 100}}) == {"x": 40, "y": 400}


def test_completion_intervals_sum_to_the_loop_and_wall_over_gpu():
    intervals = completion_intervals(10.0, [10.5, 11.5, 12.0])
    assert intervals == [0.5, 1.0, 0.5] and sum(intervals) == 2.0
    assert wall_over_gpu([2.0, 2.0], [1.0, 1.0]) == 2.0
    assert wall_over_gpu([2.0], [None]) is None and wall_over_gpu([], []) is None


# -- batching as documents are planned ---------------------------------------------------------------


def _chunks(doc_lengths):
    """(doc, index, shape) triples: each document's chunks, the last one shorter."""
    return {d: [(d, i, 8 if i < n - 1 else 3 + d) for i in range(n)] for d, n in enumerate(doc_lengths)}


def test_streamed_batches_are_make_batches_batches():
    from trtforge.runtime.planning import make_batches

    planned = _chunks([5, 1, 7, 3])
    key = lambda c: c[2]  # noqa: E731
    got = list(stream_batches(4, lambda d: planned[d], Batcher(3, key), workers=2))
    chunks = [SimpleNamespace(feeds={"x": np.zeros((1, c[2]))}, c=c) for d in range(4) for c in planned[d]]
    expected = [[x.c for x in b] for b in make_batches(chunks, 3)]
    assert sorted(got) == sorted(expected)
    assert [c for b in got for c in b if c[2] == 8] == [c for b in expected for c in b if c[2] == 8]  # order within a shape
    naive = list(stream_batches(4, lambda d: planned[d], Batcher(3, key, naive=True)))
    assert naive == [[c] for d in range(4) for c in planned[d]]


def test_with_no_planning_threads_each_document_is_planned_on_the_consumers_thread_when_needed():
    """workers=0: the same batches as with threads, every document planned on the thread that takes the batches, and
    only once the batches before it are taken (no thread contends with it for the GIL, nothing is planned ahead)."""
    planned = _chunks([5, 1, 7, 3])
    key = lambda c: c[2]  # noqa: E731
    threads, order = set(), []

    def plan(d):
        threads.add(threading.get_ident())
        order.append(("plan", d))
        return planned[d]

    registered = []
    got = []
    for batch in stream_batches(4, plan, Batcher(3, key), workers=0, ahead=8, on_plan=lambda d, cs: registered.append(d)):
        assert all(c[0] in registered for c in batch)
        order.append(("batch", len(got)))
        got.append(batch)
    assert threads == {threading.get_ident()}
    assert got == list(stream_batches(4, lambda d: planned[d], Batcher(3, key), workers=2))
    assert order[:3] == [("plan", 0), ("batch", 0), ("plan", 1)]  # document 1 planned after document 0's full batch was taken


def test_with_no_planning_threads_a_planning_error_reaches_the_consumer_and_closing_stops_planning():
    planned = _chunks([4, 4, 4, 4])
    calls = []

    def plan(d):
        calls.append(d)
        if d == 2:
            raise RuntimeError("planning failed")
        return planned[d]

    with pytest.raises(RuntimeError, match="planning failed"):
        list(stream_batches(4, plan, Batcher(3, lambda c: c[2]), workers=0))
    assert calls == [0, 1, 2]  # nothing after the failed document
    calls.clear()
    stream = stream_batches(4, plan, Batcher(3, lambda c: c[2]), workers=0)
    next(stream)
    stream.close()
    assert calls == [0]  # closed after the first batch: no document planned after it


def test_add_many_forms_the_batches_add_forms_one_chunk_at_a_time():
    rng = np.random.default_rng(3)
    docs = [[(d, i, int(k)) for i, k in enumerate(rng.choice([8, 8, 8, 4], size=int(n)))] for d, n in enumerate(rng.integers(1, 12, 9))]
    one, many = Batcher(3, lambda c: c[2]), Batcher(3, lambda c: c[2])
    by_one = [b for doc in docs for c in doc for b in one.add(c)] + one.flush()
    by_many = [b for doc in docs for b in many.add_many(doc)] + many.flush()
    assert by_many == by_one and len(by_one) > 5
    assert Batcher(3, lambda c: c[2], naive=True).add_many(docs[0]) == [[c] for c in docs[0]]


def test_batch_parts_are_block_slices_that_stack_to_the_batch():
    from trtforge.runtime.documents import Chunk
    from trtforge.runtime.planning import batch_parts, stack

    def block_chunks(d, rows, base):
        block = {"input_ids": np.arange(rows * 4).reshape(rows, 4) + base, "attention_mask": np.ones((rows, 4), np.int64)}
        return [Chunk(d, r, {k: v[r : r + 1] for k, v in block.items()}, None, 4, block=block, row=r) for r in range(rows)]

    a, b = block_chunks(0, 5, 0), block_chunks(1, 3, 100)
    loose = Chunk(2, 0, {"input_ids": np.full((1, 4), 7), "attention_mask": np.ones((1, 4), np.int64)}, None, 4)
    batch = a[1:4] + [loose] + b + [a[4]]  # a[4] is not next to a[3] in the batch: a part of its own
    parts = batch_parts(batch)
    assert [len(p) for p in parts["input_ids"]] == [3, 1, 3, 1]
    assert np.shares_memory(parts["input_ids"][0], a[0].block["input_ids"])
    for name, value in stack(batch).items():
        np.testing.assert_array_equal(np.concatenate(parts[name]), value)


def test_a_block_chunk_is_its_blocks_row_also_after_replace_and_stages_as_block_slices():
    from dataclasses import replace

    from trtforge.runtime.documents import BlockChunk
    from trtforge.runtime.planning import batch_parts, stack

    block = {"input_ids": np.arange(12).reshape(3, 4), "attention_mask": np.ones((3, 4), np.int64)}
    chunks = [BlockChunk(0, r, None, None, 4, slice(1, 3), block, r, ("k",)) for r in range(3)]
    np.testing.assert_array_equal(chunks[1].feeds["input_ids"], [[4, 5, 6, 7]])
    moved = replace(chunks[2], doc=5)  # scaleout/ray_run.py renumbers documents this way
    assert isinstance(moved, BlockChunk) and moved.doc == 5 and moved.row == 2 and moved.block is block
    np.testing.assert_array_equal(moved.feeds["input_ids"], [[8, 9, 10, 11]])
    parts = batch_parts(chunks[1:])
    assert [len(p) for p in parts["input_ids"]] == [2]
    np.testing.assert_array_equal(np.concatenate(parts["input_ids"]), stack(chunks[1:])["input_ids"])
    with pytest.raises(ValueError, match="give block"):
        BlockChunk(0, 0, {"input_ids": block["input_ids"][:1]})


def test_batches_run_while_later_documents_are_still_being_planned():
    """Document 1 cannot finish planning until the consumer holds the first batch: a loop that planned
    every document before running any batch would time out here."""
    planned = _chunks([4, 4, 4])
    first_batch_taken = threading.Event()
    registered = set()

    def plan(d):
        if d > 0 and not first_batch_taken.wait(timeout=20):
            raise AssertionError("planning did not overlap execution")
        return planned[d]

    seen = []
    for batch in stream_batches(3, plan, Batcher(3, lambda c: c[2]), workers=2, on_plan=lambda d, cs: registered.add(d)):
        assert all(c[0] in registered for c in batch)  # a document is registered before its chunks arrive
        first_batch_taken.set()
        seen += batch
    assert sorted(seen) == sorted(c for d in range(3) for c in planned[d])


@pytest.mark.parametrize("ahead", [0, 1])
def test_closing_the_stream_early_plans_no_further_document(ahead):
    """run closes the stream when its loop fails: documents queued but not started are never planned (their
    merged outputs would be allocated after the run gave up)."""
    import time

    planned = []

    def plan(d):
        time.sleep(0.02)
        planned.append(d)
        return [(d, 0, 8)]

    stream = stream_batches(40, plan, Batcher(1, lambda c: c[2]), workers=2, ahead=ahead)
    next(stream)
    stream.close()
    assert len(planned) < 10, planned


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_stream_finalized_on_a_planning_thread_does_not_wait_for_itself(ahead):
    """An iterator nobody closed (a loop that raised) is finalized by the garbage collector on whichever thread
    happens to run it; on a planning thread, joining the planner would wait for itself forever."""
    import threading

    holder, abandoned, finished = {}, threading.Event(), threading.Event()

    def plan(d):
        if d == 3:
            abandoned.wait(5)  # the consumer has its batch and left the iterator suspended
            holder["stream"].close()  # what the garbage collector does with the abandoned iterator, here
            finished.set()
        return [(d, 0, 8)]

    holder["stream"] = stream_batches(6, plan, Batcher(1, lambda c: c[2]), workers=1, ahead=ahead)
    next(holder["stream"])
    abandoned.set()
    assert finished.wait(5), "the planning thread is stuck joining itself"


def test_planning_stays_a_bounded_lead_ahead_of_the_consumer():
    """With `ahead`, a consumer that stops taking batches stops planning: the batch it holds, `ahead` queued, the one
    the producer is putting and the documents the threads were handed after it (2 x workers - 1): 1 + 2 + 1 + 3 = 7
    of 40 here. Unbounded, every document is planned at once (the start-up stall on the H200 box). Every batch
    still arrives, in order, once consumed."""
    import time

    def run(ahead, settle):
        planned = []

        def plan(d):
            planned.append(d)
            return [(d, 0, 8)]

        stream = stream_batches(40, plan, Batcher(1, lambda c: c[2]), workers=2, ahead=ahead)
        first = next(stream)
        deadline = time.monotonic() + 5
        while not settle(planned) and time.monotonic() < deadline:  # the consumer is busy: planning fills its lead
            time.sleep(0.01)
        time.sleep(0.2)  # and would go on here, were it unbounded
        held = len(planned)
        return held, [first, *stream]

    held, batches = run(ahead=2, settle=lambda planned: len(planned) >= 7)
    assert held == 7, held
    assert batches == [[(d, 0, 8)] for d in range(40)]
    held, batches = run(ahead=0, settle=lambda planned: len(planned) == 40)
    assert held == 40
    assert batches == [[(d, 0, 8)] for d in range(40)]


@pytest.mark.parametrize("how", ["close", "raise"])
def test_a_consumer_that_leaves_while_planning_waits_on_a_full_queue_returns_at_once(how):
    """run closes the stream when its loop fails; with a bounded lead the producer is then blocked putting a batch
    into a full queue, and must notice that nobody will take it (else `run` hangs in its cleanup)."""
    import time

    stream = stream_batches(40, lambda d: [(d, 0, 8)], Batcher(1, lambda c: c[2]), workers=2, ahead=1)
    next(stream)
    time.sleep(0.2)  # planning has filled the queue and blocks
    raised = []

    def leave():
        if how == "close":
            stream.close()
        else:
            try:
                stream.throw(RuntimeError("the loop failed"))
            except RuntimeError as exc:
                raised.append(exc)

    leaving = threading.Thread(target=leave, daemon=True)  # a hang fails the test instead of stalling the suite
    leaving.start()
    leaving.join(5)
    assert not leaving.is_alive(), "the stream did not return: its producer is stuck on the full queue"
    assert how == "close" or raised


@pytest.mark.parametrize("ahead", [0, 1])
def test_a_planning_error_reaches_the_consumer(ahead):
    def plan(d):
        if d == 1:
            raise ValueError("bad document")
        return [(d, 0, 8)]

    with pytest.raises(ValueError, match="bad document"):
        list(stream_batches(3, plan, Batcher(2, lambda c: c[2]), ahead=ahead))


# -- TrtRunner through a fake CUDA + TensorRT ----------------------------------------------------------


class FakeCudart:
    """cuda.bindings.runtime, executed on the host at once. Memory is host memory; capture records ops."""

    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
    cudaStreamCaptureMode = SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)

    def __init__(self):
        self.buffers, self.capturing, self.streams, self.executables = {}, {}, 0, {}
        self.used = 0

    def _alloc(self, n):
        buf = ctypes.create_string_buffer(int(n))
        self.buffers[ctypes.addressof(buf)] = buf
        self.used += int(n)
        return 0, ctypes.addressof(buf)

    cudaMalloc = cudaMallocHost = _alloc

    def _free(self, ptr):
        self.used -= len(self.buffers.pop(ptr))
        return (0,)

    cudaFree = cudaFreeHost = _free

    def cudaMemGetInfo(self):
        return 0, 10**12 - self.used, 10**12

    def cudaStreamCreate(self):
        self.streams += 1
        return 0, self.streams

    def cudaEventCreate(self):
        self.streams += 1
        return 0, 1000 + self.streams

    cudaEventBlockingSync = 7  # not CUDA's 1: a test can tell the constant was read

    def cudaEventCreateWithFlags(self, flags):
        err, event = self.cudaEventCreate()
        self.event_flags = {**getattr(self, "event_flags", {}), event: flags}
        return err, event

    def op(self, stream, fn):
        if stream in self.capturing:
            self.capturing[stream].append(fn)
        else:
            fn()

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        if kind == 2:
            self._check_host(dst, n)
        self.op(stream, lambda: ctypes.memmove(dst, src, n))
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert width <= dpitch and width <= spitch or height == 1, "a 2-D copy's pitches are at least its width"
        for row in range(height):
            self.cudaMemcpyAsync(dst + row * dpitch, src + row * spitch, width, kind, stream)
        return (0,)

    def cudaEventRecord(self, event, stream):
        return (0,)

    def cudaStreamWaitEvent(self, stream, event, flags):
        return (0,)

    def cudaEventSynchronize(self, event):
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaEventDestroy(self, event):
        return (0,)

    def cudaEventElapsedTime(self, a, b):
        return 0, 1.0

    def cudaStreamBeginCapture(self, stream, mode):
        self.capturing[stream] = []
        return (0,)

    def cudaStreamEndCapture(self, stream):
        return 0, self.capturing.pop(stream)

    def cudaGraphInstantiateWithFlags(self, graph, flags):
        handle = 10_000 + len(self.executables)
        self.executables[handle] = list(graph)
        return 0, handle

    def cudaGraphLaunch(self, exe, stream):
        for fn in self.executables[exe]:
            fn()
        return (0,)

    def cudaGraphExecDestroy(self, exe):
        return (0,)

    cudaGraphDestroy = cudaGraphExecDestroy

    def cudaGetErrorString(self, err):
        return 0, b"fake error"

    def _check_host(self, ptr, n):
        """A device-to-host copy must land in pinned memory the fake allocated (a staging slot)."""
        assert any(a <= ptr and ptr + n <= a + len(b) for a, b in self.buffers.items()), f"D2H copy of {n} B to {ptr:#x}: not pinned"


def fake_driver(cudart):
    """libcuda as cuda_async.load_driver sees it (functions taking argtypes), executed by FakeCudart."""
    calls = []

    def entry(name, fn):
        def call(*args):
            calls.append(name)
            return fn(*args)

        return call

    lib = SimpleNamespace(calls=calls)
    lib.cuMemcpyHtoDAsync_v2 = entry("htod", lambda dst, src, n, stream: cudart.cudaMemcpyAsync(dst, src, n, 1, stream)[0])
    lib.cuMemcpyDtoHAsync_v2 = entry("dtoh", lambda dst, src, n, stream: cudart.cudaMemcpyAsync(dst, src, n, 2, stream)[0])

    def copy_2d(pointer, stream):
        c = pointer._obj
        assert (c.srcMemoryType, c.dstMemoryType) == (2, 1), "device to host"
        return cudart.cudaMemcpy2DAsync(c.dstHost, c.dstPitch, c.srcDevice, c.srcPitch, c.WidthInBytes, c.Height, 2, stream)[0]

    lib.cuMemcpy2DAsync_v2 = entry("dtoh_2d", copy_2d)
    lib.cuEventRecord = entry("record", lambda event, stream: 0)
    lib.cuStreamWaitEvent = entry("wait", lambda stream, event, flags: 0)
    lib.cuGraphLaunch = entry("launch", lambda exe, stream: cudart.cudaGraphLaunch(exe, stream)[0])

    def elapsed(out, start, end):
        out._obj.value = 1.0
        return 0

    lib.cuEventElapsedTime = entry("elapsed", elapsed)
    lib.cuGetErrorName = entry("error_name", lambda code, out: 0)

    def get_current(out):
        out._obj.value = 0xC0
        return 0

    lib.cuCtxGetCurrent = entry("get_context", get_current)
    lib.cuCtxSetCurrent = entry("set_context", lambda ctx: 0)
    return lib


class FakeContext:
    """y[b, s] = (x[b, s] * 2 + profile, S): S comes from the context's host shape state when the
    enqueue runs, which an enqueue refreshes (TensorRT's deferred shape update)."""

    def __init__(self, engine, memory=None):
        self.engine, self.device_memory, self.addresses, self.shape = engine, memory, {}, None
        self.host_state = [0, 0]  # batch, seq: read by the kernels at run time

    def set_device_memory(self, ptr, size):
        self.device_memory = ptr

    def set_optimization_profile_async(self, profile, stream):
        self.profile = profile

    def set_input_shape(self, name, dims):
        self.shape = tuple(int(d) for d in dims)
        return self.engine.lo[self.profile] <= self.shape[1] <= self.engine.hi[self.profile]

    def get_tensor_shape(self, name):
        return self.shape if name == "x" else (*self.shape, 2)

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr

    def execute_async_v3(self, stream):
        cudart = self.engine.cudart
        if stream in cudart.capturing and self.engine.capture_fails:
            return False
        self.host_state[:] = self.shape
        x_ptr, y_ptr, state, profile = self.addresses["x"], self.addresses["y"], self.host_state, self.profile

        def kernel():
            b, s = state
            x = np.frombuffer((ctypes.c_int32 * (b * s)).from_address(x_ptr), np.int32).reshape(b, s)
            y = np.frombuffer((ctypes.c_float * (b * s * 2)).from_address(y_ptr), np.float32).reshape(b, s, 2)
            y[..., 0] = x * 2 + profile
            y[..., 1] = s

        cudart.op(stream, kernel)
        return True


class FakeEngine:
    num_io_tensors = 2
    device_memory_size = 4096

    def __init__(self, cudart, capture_fails=False):
        self.cudart, self.capture_fails = cudart, capture_fails
        self.lo, self.hi = [1, 9], [8, 16]
        self.contexts = []

    def get_tensor_name(self, i):
        return ["x", "y"][i]

    def get_tensor_mode(self, name):
        return "in" if name == "x" else "out"

    def get_tensor_dtype(self, name):
        return np.int32 if name == "x" else np.float32

    def create_execution_context_without_device_memory(self):
        self.contexts.append(FakeContext(self))
        return self.contexts[-1]

    def create_execution_context(self):
        self.contexts.append(FakeContext(self, memory="own"))
        return self.contexts[-1]


class FakeLogger:
    ERROR = 0

    def __init__(self, level):
        pass


def _runner(monkeypatch, tmp_path, **kwargs):
    from trtforge.backends import tensorrt_runtime as rt
    from trtforge.backends.tensorrt import TrtModule

    cudart = FakeCudart()
    engine = FakeEngine(cudart, capture_fails=kwargs.pop("capture_fails", False))
    trt = SimpleNamespace(Logger=FakeLogger, TensorIOMode=SimpleNamespace(INPUT="in"), nptype=lambda t: t)
    trt.Runtime = lambda logger: SimpleNamespace(deserialize_cuda_engine=lambda data: engine)
    monkeypatch.setattr(rt, "cuda_runtime", lambda: cudart)
    monkeypatch.setattr("trtforge.backends.cuda_memory.cuda_runtime", lambda: cudart)
    driver = kwargs.pop("driver", None) or fake_driver(cudart)
    monkeypatch.setattr(rt, "submit_calls", lambda c, check, event, stream: submit_calls(c, check, event, stream, driver))
    monkeypatch.setattr(rt, "check_gpu_supported", lambda flavour, path: None)
    path = tmp_path / "fake.engine"
    path.write_bytes(b"engine")
    profiles = [
        {"index": i, "axes": {"batch": [1, 4, 4], "seq": [lo, hi, hi]}, "shapes": {"x": {"min": [1, lo], "opt": [4, hi], "max": [4, hi]}}}
        for i, (lo, hi) in enumerate([(1, 8), (9, 16)])
    ]
    sidecar = {"profiles": profiles, "inputs": [{"name": "x", "shape": ["batch", "seq"]}]}
    if "io" in kwargs:  # the engine's I/O shapes as the build's sidecar records them (padding reads them)
        sidecar["io"] = kwargs.pop("io")
    return rt.TrtRunner(TrtModule(trt, "tensorrt", "8.6.0"), path, sidecar, **kwargs), engine


SEQUENCE = [(4, 8), (4, 8), (4, 8), (4, 8), (2, 5), (4, 8), (4, 8), (4, 12), (4, 12), (4, 12), (4, 8), (4, 8), (1, 3), (4, 8)]


def _batches():
    rng = np.random.default_rng(0)
    return [(i, {"x": rng.integers(0, 1000, size=shape).astype(np.int64)}) for i, shape in enumerate(SEQUENCE)]


def _expected(feeds):
    x = feeds["x"]
    profile = 0 if x.shape[1] <= 8 else 1
    return np.stack([x * 2 + profile, np.full(x.shape, x.shape[1])], axis=-1).astype(np.float32)


@pytest.mark.parametrize("graphs", [True, False])
def test_trt_runner_outputs_match_with_and_without_cuda_graphs(monkeypatch, tmp_path, graphs):
    runner, engine = _runner(monkeypatch, tmp_path, slots=3, cuda_graphs=graphs)
    batches = _batches()
    got = list(runner.run_many(batches))
    assert [tag for tag, _ in got] == list(range(len(batches)))  # submission order
    for (tag, out), (_, feeds) in zip(got, batches):
        np.testing.assert_array_equal(out["y"], _expected(feeds))
    report = runner.runtime_report()
    if graphs:
        assert report["cuda_graphs"]["replayed"] == 3 and report["cuda_graphs"]["captured"] == 5  # see GraphCache
    else:
        assert report["cuda_graphs"]["replayed"] == 0 and report["cuda_graphs"]["captured"] == 0
    assert len(runner.timings) == len(batches) and all(t.gpu_ms == 1.0 for t in runner.timings)
    runner.close()


def test_replaying_a_graph_after_the_context_ran_another_shape_would_be_wrong(monkeypatch, tmp_path):
    """The fake is strict enough to catch the hazard GraphCache avoids: a cache that replays a graph
    whatever shape the context last ran gives wrong outputs."""
    runner, _ = _runner(monkeypatch, tmp_path, slots=2, pad_batches=False)  # padded, the (2, 8) batch would replay (4, 8)

    def careless(profile, shape, slot):
        if (profile, shape, slot) in runner.graphs.graphs:
            return LAUNCH
        return CAPTURE if runner.graphs.current.get(profile) == shape else ENQUEUE

    monkeypatch.setattr(runner.graphs, "action", careless)
    batches = [(i, {"x": np.full(shape, i, np.int64)}) for i, shape in enumerate([(4, 8), (4, 8), (4, 8), (2, 8), (4, 8)])]
    outs = dict(runner.run_many(batches))
    assert not np.array_equal(outs[4]["y"], _expected(batches[4][1]))


def test_a_partial_batch_is_padded_to_the_fewest_rows_that_ran_at_its_other_dims():
    assert padded_batch({"ids": (3, 256), "mask": (3, 256)}, {64, 16, 2}) == 16
    assert padded_batch({"ids": (64, 256)}, {64}) is None  # a size that ran: as it is
    assert padded_batch({"ids": (70, 256)}, {64}) is None  # none larger ran
    assert padded_batch({"ids": (3, 256)}, set()) is None
    assert padded_batch({"ids": (3, 256), "other": (4, 2)}, {8}) is None  # the inputs disagree on the batch axis


@pytest.mark.parametrize("parts", [False, True], ids=["array", "chunk-parts"])
def test_a_partial_last_batch_replays_the_full_batchs_graph_and_hands_on_its_own_rows(monkeypatch, tmp_path, parts):
    rng = np.random.default_rng(1)
    shapes = [(4, 8)] * 5 + [(3, 8), (1, 12), (4, 12)]  # (1, 12): nothing ran at seq 12 before it, so it runs as it is
    batches = [(i, {"x": rng.integers(0, 1000, size=shape).astype(np.int32)}) for i, shape in enumerate(shapes)]
    fed = [
        (tag, {"x": [x[j : j + 1] for j in range(len(x))]} if parts else {"x": x})
        for tag, x in ((tag, feeds["x"]) for tag, feeds in batches)
    ]
    results = {}
    for pad in (True, False):
        runner, engine = _runner(monkeypatch, tmp_path, slots=2, pad_batches=pad, io=BATCH_LEADING)
        got = list(runner.run_many(fed))
        for (tag, out), (_, feeds) in zip(got, batches):
            assert out["y"].shape[0] == feeds["x"].shape[0]
            np.testing.assert_array_equal(out["y"], _expected(feeds))
        results[pad] = runner.runtime_report()
        runner.close()
    padded, plain = results[True], results[False]
    assert padded["padding"] == {"enabled": True, "batches": 1, "rows": 1}
    assert plain["padding"] == {"enabled": False, "batches": 0, "rows": 0}
    # padded, the partial batch replayed the (4, 8) graph; as it is, it was a shape of its own, enqueued plainly
    assert padded["cuda_graphs"]["plain_enqueues"] == plain["cuda_graphs"]["plain_enqueues"] - 1
    assert padded["cuda_graphs"]["replayed"] == plain["cuda_graphs"]["replayed"] + 1


BATCH_LEADING = [{"name": "x", "mode": "in", "shape": [-1, -1]}, {"name": "y", "mode": "output", "shape": [-1, -1, 2]}]


@pytest.mark.parametrize("why", ["output-not-batch-leading", "no-io-shapes", "profile-given"])
def test_a_partial_batch_is_not_padded_where_rows_might_not_stay_rows(monkeypatch, tmp_path, why):
    """Padding only where every input leads with the one batch axis and every output's axis 0 is dynamic (a static or
    flattened leading axis would mix the padding rows into what is handed on), and never on a profile the caller chose."""
    io = {
        "output-not-batch-leading": [{"name": "y", "mode": "output", "shape": [4, -1, 2]}],
        "no-io-shapes": None,
        "profile-given": BATCH_LEADING,
    }[why]
    runner, _ = _runner(monkeypatch, tmp_path, slots=2, pad_batches=True, **({"io": io} if io is not None else {}))
    batches = [(i, {"x": np.full(shape, i, np.int32)}) for i, shape in enumerate([(4, 8), (4, 8), (3, 8)])]
    outs = dict(runner.run_many(batches, profile=0 if why == "profile-given" else None))
    np.testing.assert_array_equal(outs[2]["y"], _expected(batches[2][1]))
    report = runner.runtime_report()["padding"]
    assert report["batches"] == 0
    assert report["enabled"] is (why == "profile-given") and ("reason" in report) is (why != "profile-given")


def test_a_blocking_gpu_wait_syncs_on_blocking_events_with_the_same_outputs(monkeypatch, tmp_path):
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions

    runner, engine = _runner(monkeypatch, tmp_path, slots=2, gpu_wait="block")
    for (tag, out), (_, feeds) in zip(runner.run_many(_batches()), _batches()):
        np.testing.assert_array_equal(out["y"], _expected(feeds))
    # one blocking-sync event per slot: the one the collector waits on
    assert engine.cudart.event_flags == {slot.events["d2h"]: 7 for slot in runner.slots}
    assert runner.runtime_report()["gpu_wait"] == "block"
    spinning, engine = _runner(monkeypatch, tmp_path, slots=2)
    assert not hasattr(engine.cudart, "event_flags") and spinning.runtime_report()["gpu_wait"] == "spin"
    with pytest.raises(UserError, match="--gpu-wait"):
        RunOptions(inputs=tmp_path, gpu_wait="sleep")


def test_profile_contexts_share_one_device_memory_block(monkeypatch, tmp_path):
    runner, engine = _runner(monkeypatch, tmp_path)
    assert len(engine.contexts) == 2 and len({c.device_memory for c in engine.contexts}) == 1
    assert engine.contexts[0].device_memory == runner._memory.ptr
    assert runner.runtime_report()["shared_device_memory"]["enabled"] is True
    own, engine2 = _runner(monkeypatch, tmp_path, shared_device_memory=False)
    assert {c.device_memory for c in engine2.contexts} == {"own"}
    assert own.runtime_report()["shared_device_memory"]["enabled"] is False


def test_a_failed_capture_falls_back_to_plain_enqueues_and_is_reported(monkeypatch, tmp_path):
    runner, _ = _runner(monkeypatch, tmp_path, capture_fails=True)
    batches = _batches()
    for (tag, out), (_, feeds) in zip(runner.run_many(batches), batches):
        np.testing.assert_array_equal(out["y"], _expected(feeds))
    report = runner.runtime_report()["cuda_graphs"]
    assert report["replayed"] == 0 and report["fallbacks"] and "under capture" in report["fallbacks"][0]["reason"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64], ids=["memmove", "numpy-cast"])
def test_a_batch_given_as_its_chunks_is_stacked_in_pinned_memory(monkeypatch, tmp_path, dtype):
    runner, _ = _runner(monkeypatch, tmp_path)  # the engine's x is int32: int64 parts take numpy's cast
    parts = [np.full((1, 8), i, dtype) for i in range(3)]
    out = runner.run({"x": parts})
    np.testing.assert_array_equal(out["y"], _expected({"x": np.concatenate(parts)}))


def test_submit_calls_hold_the_gil_through_libcuda_and_fall_back_to_cuda_python_when_the_probe_fails(monkeypatch, tmp_path):
    from trtforge.backends.cuda_async import AsyncCuda, CudaPythonCalls

    driver = fake_driver(FakeCudart())
    runner, _ = _runner(monkeypatch, tmp_path, driver=None)
    assert isinstance(runner.cuda, AsyncCuda) and runner.runtime_report()["submit_calls"] == "libcuda through ctypes, GIL held"
    broken = SimpleNamespace(**{k: v for k, v in vars(driver).items() if k != "calls"})
    broken.cuEventRecord = lambda event, stream: 201  # CUDA_ERROR_INVALID_CONTEXT
    runner, _ = _runner(monkeypatch, tmp_path, driver=broken)
    assert isinstance(runner.cuda, CudaPythonCalls)
    assert "cuda-python" in runner.runtime_report()["submit_calls"] and "cuEventRecord failed" in runner.runtime_report()["submit_calls"]
    batches = _batches()
    for (tag, out), (_, feeds) in zip(runner.run_many(batches), batches):
        np.testing.assert_array_equal(out["y"], _expected(feeds))


def test_without_the_shared_memory_api_contexts_get_their_own_and_the_report_says_why(monkeypatch, tmp_path):
    monkeypatch.delattr(FakeEngine, "create_execution_context_without_device_memory")
    runner, engine = _runner(monkeypatch, tmp_path)
    assert {c.device_memory for c in engine.contexts} == {"own"}
    report = runner.runtime_report()["shared_device_memory"]
    assert report["enabled"] is False and "create_execution_context_without_device_memory" in report["reason"]
    np.testing.assert_array_equal(runner.run({"x": np.ones((2, 4), np.int64)})["y"], _expected({"x": np.ones((2, 4), np.int64)}))


def test_stage_clock_sums_each_stage_over_threads():
    import threading
    import time

    from trtforge.runtime.loop import StageClock

    clock = StageClock()

    def work():
        with clock.stage("copy_out"):
            time.sleep(0.02)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with clock.stage("merge"):
        pass
    with clock.stage("plan"):  # work: its CPU time is most of its wall time
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
    report = clock.report()
    assert report["copy_out"]["count"] == 3 and report["copy_out"]["seconds"] >= 0.06
    assert report["copy_out"]["cpu_seconds"] < 0.5 * report["copy_out"]["seconds"]  # sleeping: waiting, not work
    assert report["plan"]["cpu_seconds"] >= 0.05 and report["plan"]["cpu_seconds"] <= report["plan"]["seconds"] + 1e-3
    assert report["merge"]["count"] == 1 and set(report) == {"copy_out", "merge", "plan"}


def test_trt_runner_reports_where_the_host_time_went(monkeypatch, tmp_path):
    runner, _ = _runner(monkeypatch, tmp_path)
    batches = _batches()
    list(runner.run_many(batches))
    stages = runner.runtime_report()["host_seconds"]
    n = len(batches)
    assert stages["submit"]["count"] == stages["stage_inputs"]["count"] == n
    assert stages["wait_gpu"]["count"] == stages["copy_out"]["count"] == n
    assert stages.get("wait_slot", {"count": 0})["count"] <= n - len(runner.slots)  # only when a slot was still busy
    assert all(v["seconds"] >= 0 for v in stages.values())


def test_runtime_logger_holds_errors_during_a_capture_attempt_and_prints_them_otherwise(capsys):
    """An engine that refuses CUDA-graph capture (RoBERTa on 8.6) says so in a TensorRT error: during the
    attempt it becomes the fallback's reason instead of a stray error line."""
    from trtforge.backends.tensorrt_runtime import RuntimeLogger

    severity = SimpleNamespace(INTERNAL_ERROR=0, ERROR=1, WARNING=2, INFO=3, VERBOSE=4)

    class ILogger:
        Severity = severity

        def __init__(self):
            pass

    logger = RuntimeLogger(SimpleNamespace(ILogger=ILogger))
    with logger.holding() as held:
        logger.impl.log(severity.ERROR, "Error Code 3: the CUDA stream is in capturing mode, but this TRT engine is not stream capturable!")
        logger.impl.log(severity.INFO, "ignored")
    assert held == ["Error Code 3: the CUDA stream is in capturing mode, but this TRT engine is not stream capturable!"]
    assert capsys.readouterr().err == ""
    logger.impl.log(severity.ERROR, "a real failure")
    assert "TensorRT: a real failure" in capsys.readouterr().err


def test_consume_reads_each_batch_from_the_pinned_slot_without_copying(monkeypatch, tmp_path):
    """run_many(consume=...): the collector hands each batch's outputs as views of its pinned slot (no copy_out,
    no fresh arrays), in submission order, and yields what consume returned. The views are the slot's memory:
    batch i and batch i + slots share it, which is why consume must finish with them before returning."""
    runner, _ = _runner(monkeypatch, tmp_path, slots=3)
    batches = _batches()
    seen, views = {}, {}

    def consume(tag, out):
        seen[tag] = out["y"].copy()
        views[tag] = out["y"]
        return -tag

    got = list(runner.run_many(batches, consume=consume))
    assert got == [(i, -i) for i in range(len(batches))]
    for tag, feeds in batches:
        np.testing.assert_array_equal(seen[tag], _expected(feeds))
    assert np.shares_memory(views[0], views[3]) and not np.shares_memory(views[0], views[1])
    assert "copy_out" not in runner.runtime_report()["host_seconds"]
    runner.close()


def test_a_slot_waits_for_the_work_consume_handed_on(monkeypatch, tmp_path):
    """consume may hand its work to other threads and return a Future (run's overlapped merges): the collector goes
    on, but the slot is restaged only once that work is done, so a late reader still sees its own batch, not the
    next one staged into the same slot; what is yielded is the future's result, in order."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    runner, _ = _runner(monkeypatch, tmp_path, slots=2)
    batches = _batches()
    seen, running, peak = {}, [0], [0]
    lock = threading.Lock()

    def late_read(tag, view):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)  # long after the next batches were staged, were the slot not held
        seen[tag] = view.copy()
        with lock:
            running[0] -= 1
        return -tag

    with ThreadPoolExecutor(4) as pool:
        got = list(runner.run_many(batches, consume=lambda tag, out: pool.submit(late_read, tag, out["y"])))
    assert got == [(i, -i) for i in range(len(batches))]
    for tag, feeds in batches:
        np.testing.assert_array_equal(seen[tag], _expected(feeds))
    assert peak[0] >= 2  # the collector went on while a batch's work ran: two batches' work overlapped
    runner.close()


def test_batch_timeline_keeps_order_and_caps():
    """The timeline lists batches in collection order, rounded, up to its limit, and says how many it left out."""
    t = batch_timeline([5.12345, 1.0, 7.5], [1.23456, None, 1.3])
    assert t == {"batches": 3, "shown": 3, "wall_ms": [5.123, 1.0, 7.5], "gpu_ms": [1.235, None, 1.3]}
    capped = batch_timeline([1.0] * 10, [0.5] * 10, limit=4)
    assert capped["batches"] == 10 and capped["shown"] == 4 and len(capped["wall_ms"]) == len(capped["gpu_ms"]) == 4
    assert batch_timeline([], []) == {"batches": 0, "shown": 0, "wall_ms": [], "gpu_ms": []}


def test_run_options_refuse_a_negative_plan_ahead():
    """The API's way in (the CLI's --plan-ahead has min=0): a negative lead would silently mean unbounded."""
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions

    with pytest.raises(UserError, match=r"--plan-ahead -1 is negative; use 0 \(no bound\)"):
        RunOptions(inputs="docs", plan_ahead=-1)
    assert RunOptions(inputs="docs", plan_ahead=0).plan_ahead == 0
    with pytest.raises(UserError, match=r"--pinned-reserve-mb -1 is negative"):
        RunOptions(inputs="docs", pinned_reserve_mb=-1)


def test_the_loops_switch_interval_is_set_while_it_runs_and_restored(minilm_clean, tmp_path):
    """--switch-interval-us: Python's GIL switch interval during the timed loop (what a thread back from a GIL-free
    copy may wait for the GIL), reported, and the caller's interval back afterwards; below 1 us is refused."""
    import sys

    import trtforge.runtime.step as run_mod
    from trtforge.core.errors import UserError
    from trtforge.runtime.options import RunOptions
    from trtforge.runtime.step import run

    with pytest.raises(UserError, match="--switch-interval-us 0 must be at least 1"):
        RunOptions(inputs="docs", switch_interval_us=0)
    seen = []
    merge_add = run_mod.Merger.add

    def recording_add(self, *args, **kwargs):
        seen.append(sys.getswitchinterval())
        return merge_add(self, *args, **kwargs)

    before = sys.getswitchinterval()
    run_mod.Merger.add = recording_add
    try:
        report = run(
            minilm_clean,
            RunOptions(
                inputs=Path("calib_data/minilm_long"),
                chunk=256,
                overlap=32,
                batch_size=16,
                warmup=0,
                precision_check=False,
                chunking_check=False,
                switch_interval_us=50,
            ),
        )
    finally:
        run_mod.Merger.add = merge_add
    assert seen and all(abs(s - 50e-6) < 2e-6 for s in seen)  # Python keeps it in whole microseconds
    assert report["runtime"]["switch_interval_us"] == 50 and sys.getswitchinterval() == before


def test_placed_outputs_go_where_place_says_and_the_slot_gets_only_its_rows(monkeypatch, tmp_path):
    """run_many(place=...) (the copy-engine merge): each batch's strided copies land in the caller's page-locked memory
    (every other row, positions 1..s-1, one 2-D copy) and the slot gets exactly the slot_rows ranges, at their offsets."""
    from trtforge.backends import tensorrt_runtime as rt
    from trtforge.runtime.copymerge import OutputCopies

    runner, _ = _runner(monkeypatch, tmp_path, slots=3)
    batches = [(tag, feeds) for tag, feeds in _batches() if feeds["x"].shape[0] >= 2]
    pinned = {tag: rt.PinnedBuffer(4 * 16 * 2 * 4) for tag, _ in batches}
    for buf in pinned.values():
        buf.view(np.float32, (buf.nbytes // 4,))[...] = np.nan

    def place(tag, shapes):
        b, s, f = shapes["y"]
        row = s * f * 4
        width = (s - 2) * f * 4
        return {"y": OutputCopies([(pinned[tag].ptr, width, f * 4, 2 * row, width, (b + 1) // 2)], [(1, b - 1)])}

    seen = {}

    def consume(tag, views):
        seen[tag] = views["y"][1:].copy()
        return tag

    assert [t for t, _ in runner.run_many(batches, consume=consume, place=place)] == [t for t, _ in batches]
    for tag, feeds in batches:
        want = _expected(feeds)
        b, s = feeds["x"].shape
        np.testing.assert_array_equal(seen[tag], want[1:])  # the slot's rows 1.. at their own offsets
        rows = (b + 1) // 2
        got = pinned[tag].view(np.float32, (rows, s - 2, 2))
        np.testing.assert_array_equal(got, want[0::2, 1 : s - 1])  # every other row's positions 1..s-1, packed
    with pytest.raises(ValueError, match="place needs consume"):
        list(runner.run_many(batches[:1], place=place))


def test_planning_threads_default_to_none_on_an_engine_and_two_on_onnx_runtime_unless_they_tokenize():
    from trtforge.runtime.step import default_plan_workers

    assert default_plan_workers(True, 16) == 8 and default_plan_workers(True, 4) == 4
    assert default_plan_workers(True, 16, engine=True) == 8  # tokenizing releases the GIL: threads on an engine too
    assert default_plan_workers(False, 16) == 2 and default_plan_workers(False, 1) == 1
    assert default_plan_workers(False, 16, engine=True) == 0


# -- a text input's windows as blocks: batches of runs, never a window at a time ---------------------------------------


def _text_plans(lengths, chunk=16, overlap=4):
    """Real plans (run.plan_document) of pre-tokenized inputs of `lengths` tokens, with [CLS]/[SEP]-like specials."""
    from trtforge.core.config import InputSpec
    from trtforge.runtime.documents import Document
    from trtforge.runtime.planning import Limits, plan_document

    tokenizer = SimpleNamespace(
        prefix=[101], suffix=[102], specials=2, capacity=lambda c, o: c - 2, type_ids=lambda block: np.zeros_like(block)
    )
    specs = [InputSpec(name=n, dtype="int64", shape=["batch", "seq"]) for n in ("input_ids", "attention_mask")]
    plans = []
    for d, n in enumerate(lengths):
        doc = Document(f"d{d}", "text", {}, n, np.arange(n, dtype=np.int64) + 1000 * d)
        plans.append(plan_document(d, doc, specs, None, chunk, overlap, Limits(seq=chunk), tokenizer, [], full_last=d % 2 == 0))
    return plans


@pytest.mark.parametrize("size", [1, 3, 8])
def test_block_plans_batch_stage_and_run_like_their_chunks_one_by_one(size):
    """A DocumentPlan's rows join a Batcher's run.Batch groups as runs; those batches equal, as chunks, the batches
    the same chunks form one by one (and make_batches), stage to the same arrays, and give the runs the per-row
    path of chunking.row_runs gives."""
    from trtforge.runtime.chunking import row_runs
    from trtforge.runtime.documents import Batch, DocumentPlan
    from trtforge.runtime.planning import batch_parts, make_batches, shape_key, stack

    plans = _text_plans([40, 9, 23, 3, 61, 14])
    assert all(isinstance(p, DocumentPlan) for p in plans)
    for plan in plans:
        assert [c.index for c in plan] == list(range(len(plan))) and plan.windows == [c.window for c in plan]
        for c in plan:
            np.testing.assert_array_equal(c.feeds["input_ids"][0, c.content], np.arange(c.window.start, c.window.end) + 1000 * c.doc)
        assert plan[-1] == plan[len(plan) - 1] and plan[1:3] == [plan[k] for k in range(1, min(3, len(plan)))]
        with pytest.raises(IndexError):
            plan[len(plan)]
    by_runs, by_chunks = Batcher(size, shape_key, group=Batch), Batcher(size, shape_key)
    got = [b for plan in plans for b in by_runs.add_many(plan)] + by_runs.flush()
    expected = [b for plan in plans for b in by_chunks.add_many(list(plan))] + by_chunks.flush()
    assert all(isinstance(b, Batch) for b in got) and got == expected
    assert sorted(map(len, got)) == sorted(map(len, make_batches([c for p in plans for c in p], size)))
    for batch in got:
        for (item, first, n), (next_item, next_first, _) in zip(batch.runs, batch.runs[1:]):
            assert not (next_item is item and next_first == first + n)  # a block's consecutive rows are one run
        assert batch.row_runs() == row_runs(list(batch))
        chunks = list(batch)
        for name, value in stack(batch).items():
            np.testing.assert_array_equal(value, np.concatenate([c.feeds[name] for c in chunks]))
            np.testing.assert_array_equal(np.concatenate(batch_parts(batch)[name]), value)
        assert batch[-1] == chunks[-1] and batch[0:2] == chunks[0:2]
        with pytest.raises(IndexError):
            batch[len(batch)]


def test_a_batch_mixes_block_rows_and_plain_chunks_in_order():
    from trtforge.runtime.chunking import RowRun, Window
    from trtforge.runtime.documents import Batch, Chunk
    from trtforge.runtime.planning import batch_parts

    plan = _text_plans([40])[0]
    block = plan.blocks[0]
    loose = Chunk(7, 0, {"input_ids": np.full((1, 16), 5), "attention_mask": np.ones((1, 16), np.int64)}, Window(0, 16, 0, 16), 16)
    batch = Batch()
    batch.add_rows(block, 0, 2)
    batch.add_rows(block, 2, 1)  # continues the run
    batch.append(loose)
    batch.add_rows(block, 3, 1)
    assert [(r, n) for _, r, n in batch.runs] == [(0, 3), (0, 1), (3, 1)] and len(batch) == 5
    assert [c.doc for c in batch] == [0, 0, 0, 7, 0] and batch[3] is loose
    assert batch.row_runs() == [RowRun(0, 0, 0, 3, 1, 14), RowRun(7, 0, 3, 1, 0, 16), RowRun(0, 3, 4, 1, 1, 14)]
    assert [len(p) for p in batch_parts(batch)["input_ids"]] == [3, 1, 1]
